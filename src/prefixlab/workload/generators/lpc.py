"""LPC conversations: text-bearing multi-turn chats whose continuation can be learned.

Learned prefix caching predicts, from a user prompt's text, whether its conversation will
continue. To test such a predictor honestly offline, this generator writes real prompt text
(``prompt_text``) where continuation depends, in part, on content. Two models (``cue``):

- ``latent`` (default): each conversation has a hidden engagement ``z ~ N(0,
  engagement_sd)``; each turn's intent is ``u = z + N(0, intent_sd)`` and the conversation
  goes on with probability ``sigmoid(base_logit + u + turn_slope * k) * (1 - leave_rate)``
  (``leave_rate``: users who leave whatever they meant). Every prompt is a neutral request
  from one pool shared by both outcomes; with probability ``cue_rate`` it carries a short
  clause leaning one way, chosen by the sign of ``u + N(0, cue_noise)``, from two pools of
  paraphrases with overlapping words. The text thus carries real but noisy information
  (earlier turns too, through ``z``), as in the paper's datasets, where the best predictor
  reaches an MCC of 0.28-0.37 (``../shared/papers/lpc-summary-zh.md``, A.3): with the
  defaults the trained predictor reaches about 0.3 (``docs/lpc.md``). With
  ``end_cue_rate`` some users say goodbye on their last turn.
- ``templates``: every prompt is *open* (asks to work through something together) or
  *closing* (a quick question, a thank-you), and the next turn follows with probability
  ``p_continue_open`` or ``p_continue_closed``: a sharp, lexical cue (MCC about 0.66 for a
  trained predictor, 0.76 for the rule itself), kept for tests that need a strong signal.

Timing follows the LPC authors' benchmark client (:class:`~prefixlab.workload.arrivals.
LPCArrivals`): conversation starts spaced by exponential gaps (``session_rate_per_s``),
held back so at most ``n_conv`` are active at once; turns spaced by exponential gaps of mean
``lambda_chat`` seconds; a conversation is active until its last reply is decoded.
Prompts are tokenised (batch) with ``tokenizer``; a turn's input is the system prompt, every
earlier user turn and reply, and the new prompt; replies are random ids of log-normal
length (mean ``mean_output_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.workload.arrivals import LPCArrivals
from prefixlab.workload.generators.base import (
    TokenSource,
    lognormal_lengths,
    param,
    register_generator,
    resolve_params,
)
from prefixlab.workload.loaders._chat import render
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Request, Trace

SYSTEM_PROMPT = "You are a helpful assistant. Answer clearly and follow up when asked."
TOPICS = {
    "cooking": ["a sourdough starter", "a weeknight curry", "knife skills", "meal prep"],
    "python": ["a decorator", "an async crawler", "unit tests", "a CSV parser"],
    "travel": ["a week in Kyoto", "a rail pass", "packing light", "a road trip"],
    "fitness": ["a 5k plan", "strength training", "a stretching routine", "recovery days"],
    "finance": ["a monthly budget", "index funds", "an emergency fund", "paying off a loan"],
    "writing": ["a cover letter", "a short story", "a blog outline", "an essay thesis"],
    "math": ["eigenvalues", "a proof by induction", "Bayes' rule", "integration by parts"],
    "gardening": ["tomato seedlings", "composting", "a shade garden", "pruning roses"],
    "music": ["chord progressions", "a practice schedule", "ear training", "home recording"],
    "history": ["the printing press", "the Silk Road", "the Meiji era", "the Hanseatic League"],
}
OPEN_TEMPLATES = [
    "Can you walk me through {thing} step by step? I want to go deeper after each part.",
    "Let's work on {thing} together for my {topic} project; start with the basics.",
    "Help me plan {thing}. We'll refine it in the next messages, so keep it a first draft.",
    "I'm learning {topic}. Teach me {thing} gradually and check my understanding as we go.",
    "Give me a first version of {thing}; I'll tell you what to change afterwards.",
    "Let's brainstorm {thing} in {topic} - list a few options and we'll pick one to expand.",
]
CLOSING_TEMPLATES = [
    "Quick question: what is {thing} in {topic}? Just one sentence please.",
    "Thanks, that's everything I needed about {thing}.",
    "In one line, define {thing}.",
    "Great, that answers it. No more questions about {topic}.",
    "What's the short answer on {thing}? No details needed.",
    "Perfect, {thing} makes sense now. That's all, thank you!",
]
FILLERS = ["", "By the way, ", "Also, ", "Okay. ", "Hmm, ", "Sure. "]
#: the latent model's requests: one pool, whatever the conversation will do
NEUTRAL_TEMPLATES = [
    "Explain {thing} in {topic}.",
    "What should I know about {thing}?",
    "How does {thing} work?",
    "Can you help with {thing}?",
    "Tell me about {thing} for {topic}.",
    "I have a question about {thing}.",
    "What are common mistakes with {thing}?",
    "Compare two approaches to {thing}.",
]
#: short clauses leaning towards a follow-up or an end, with words in common
OPEN_CUES = [
    "I'll probably have follow-ups.",
    "We can refine it after.",
    "Let's start there.",
    "Then I'd like to go further.",
    "First part only for now.",
    "Thanks, and then more.",
]
CLOSE_CUES = [
    "That should be all.",
    "Briefly, please.",
    "Just curious.",
    "Thanks in advance.",
    "One line is fine.",
    "No need to go further.",
]
CUES = ("latent", "templates")


@dataclass(frozen=True, slots=True)
class LPCParams:
    num_conversations: int = param(1000, 1, "Conversations to generate.")
    lambda_chat: float = param(100.0, 0, "Mean gap between a conversation's turns (s).", True)
    n_conv: int = param(200, 1, "Conversations active at once, at most.")
    session_rate_per_s: float = param(10.0, 0, "Rate of conversation starts.", True)
    decode_tokens_per_s: float = param(30.0, 0, "Decode speed that ends a conversation.", True)
    max_turns: int = param(12, 1, "Turns per conversation at most.")
    cue: str = param("latent", help="Continuation model: latent (noisy cues) or templates.")
    engagement_sd: float = param(1.5, 0, "latent: sd of a conversation's hidden engagement.")
    intent_sd: float = param(0.8, 0, "latent: sd of a turn's intent around it.")
    cue_rate: float = param(0.8, 0, "latent: share of prompts with a leaning clause.")
    cue_noise: float = param(0.5, 0, "latent: sd of the noise on a clause's direction.")
    leave_rate: float = param(0.1, 0, "latent: share of would-be next turns that never come.")
    base_logit: float = param(-0.3, help="latent: logit of going on at zero intent.")
    turn_slope: float = param(-0.05, help="latent: change of that logit per turn.")
    end_cue_rate: float = param(0.0, 0, "latent: share of last turns that say goodbye.")
    open_share: float = param(0.5, 0, "templates: share of open prompts.")
    p_continue_open: float = param(0.85, 0, "templates: P(next turn) after an open prompt.")
    p_continue_closed: float = param(0.1, 0, "templates: P(next turn) after a closing prompt.")
    mean_output_tokens: int = param(200, 1, "Mean reply tokens.")
    tokenizer: str = param("llama3", help="Tokenizer spec for the prompt text.")
    closed_loop: bool = param(False, help="Record think times for the engine's closed loop.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        from prefixlab.errors import ConfigError

        for name in (
            "open_share",
            "p_continue_open",
            "p_continue_closed",
            "cue_rate",
            "leave_rate",
            "end_cue_rate",
        ):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {v}")
        if self.cue not in CUES:
            raise ConfigError(f"cue must be one of {', '.join(CUES)}, got {self.cue!r}")


def _pick(rng: np.random.Generator, pool: list[str]) -> str:
    return pool[int(rng.integers(len(pool)))]


def _prompt(rng: np.random.Generator, templates: list[str]) -> str:
    topic = _pick(rng, list(TOPICS))
    thing = _pick(rng, TOPICS[topic])
    return _pick(rng, templates).format(thing=thing, topic=topic)


def conversation_texts(p: LPCParams, rng: np.random.Generator) -> tuple[list[str], list[float]]:
    """One conversation's prompts, and for each the probability that another turn follows
    (what a perfect predictor could know at best)."""
    texts: list[str] = []
    probs: list[float] = []
    z = rng.normal(0.0, p.engagement_sd) if p.cue == "latent" else 0.0
    while True:
        k = len(texts)
        if p.cue == "templates":
            is_open = bool(rng.random() < p.open_share)
            text = _prompt(rng, OPEN_TEMPLATES if is_open else CLOSING_TEMPLATES)
            text = _pick(rng, FILLERS) + text  # drawn after the prompt (traces stay as before)
            go = p.p_continue_open if is_open else p.p_continue_closed
        else:
            u = z + rng.normal(0.0, p.intent_sd)
            text = _prompt(rng, NEUTRAL_TEMPLATES)
            go = float(1.0 / (1.0 + np.exp(-(p.base_logit + u + p.turn_slope * k))))
            go *= 1.0 - p.leave_rate
        more = k + 1 < p.max_turns and bool(rng.random() < go)
        if p.cue == "latent":
            if not more and rng.random() < p.end_cue_rate:
                text += " " + _pick(rng, CLOSE_CUES)
            elif rng.random() < p.cue_rate:
                lean = u + rng.normal(0.0, p.cue_noise) > 0
                text += " " + _pick(rng, OPEN_CUES if lean else CLOSE_CUES)
        texts.append(text)
        probs.append(go if k + 1 < p.max_turns else 0.0)
        if not more:
            return texts, probs


@register_generator("lpc", LPCParams, "LPC text conversations with learnable continuation.")
def generate_lpc(params: LPCParams | None = None, **overrides: object) -> Trace:
    """Token-form conversations with ``prompt_text``, in arrival order."""
    p = resolve_params(LPCParams, params, overrides, "lpc")
    rng = np.random.default_rng(p.seed)
    tokens = TokenSource(p.seed, get_tokenizer(p.tokenizer).vocab_size)
    # 1. Structure and text: whether another turn follows, and the prompts that hint at it.
    convs = [conversation_texts(p, rng)[0] for _ in range(p.num_conversations)]
    # 2. One batch tokenisation of every prompt (and the system prompt).
    tok = get_tokenizer(p.tokenizer)
    flat = [render("system", SYSTEM_PROMPT)] + [render("user", t) for c in convs for t in c]
    ids, offs = tok.encode_batch(flat)
    system = ids[offs[0] : offs[1]]
    # 3. Times and token sequences.
    arrivals = LPCArrivals(
        lambda_chat=p.lambda_chat,
        n_conv=p.n_conv,
        session_rate_per_s=p.session_rate_per_s,
        decode_tokens_per_s=p.decode_tokens_per_s,
        closed_loop=p.closed_loop,
    )
    requests: list[Request] = []
    j = 1
    for c, texts in enumerate(convs):
        replies = lognormal_lengths(rng, p.mean_output_tokens, len(texts))
        times, gaps = arrivals.schedule(len(texts), rng, output_tokens=int(replies.sum()))
        thinks = arrivals.think_times(gaps)
        history = system
        for k, text in enumerate(texts):
            prompt = np.concatenate([history, ids[offs[j] : offs[j + 1]]])
            reply = tokens.draw(int(replies[k]))
            requests.append(
                Request(
                    arrival_s=float(times[k]),
                    input_length=int(prompt.shape[0]),
                    output_length=int(reply.shape[0]),
                    session_id=f"c{c}",
                    turn=k,
                    task="chat",
                    input_tokens=prompt,
                    output_tokens=reply,
                    prompt_text=text,
                    think_s=thinks[k],
                )
            )
            history = np.concatenate([prompt, reply])
            j += 1
    requests.sort(key=lambda r: r.arrival_s)
    return Trace.from_requests(requests, name=f"lpc-seed{p.seed}")
