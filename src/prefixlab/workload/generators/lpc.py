"""LPC conversations: text-bearing multi-turn chats whose continuation can be learned.

Learned prefix caching predicts, from a user prompt's text, whether its conversation will
continue. To test such a predictor honestly offline, this generator writes real prompt text
(``prompt_text``) where continuation depends on content: every prompt is *open* (asks to
work through something together, to go deeper next) or *closing* (a quick factual question,
a thank-you); after an open prompt the conversation continues with probability
``p_continue_open``, after a closing one with ``p_continue_closed``. Topic words and
phrasings vary, so a model must learn the cue, not one string. ``open_share`` is the share
of open prompts.

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


@dataclass(frozen=True, slots=True)
class LPCParams:
    num_conversations: int = param(1000, 1, "Conversations to generate.")
    lambda_chat: float = param(100.0, 0, "Mean gap between a conversation's turns (s).", True)
    n_conv: int = param(200, 1, "Conversations active at once, at most.")
    session_rate_per_s: float = param(10.0, 0, "Rate of conversation starts.", True)
    decode_tokens_per_s: float = param(30.0, 0, "Decode speed that ends a conversation.", True)
    max_turns: int = param(12, 1, "Turns per conversation at most.")
    open_share: float = param(0.5, 0, "Share of prompts that are open (invite a follow-up).")
    p_continue_open: float = param(0.85, 0, "P(next turn) after an open prompt.")
    p_continue_closed: float = param(0.1, 0, "P(next turn) after a closing prompt.")
    mean_output_tokens: int = param(200, 1, "Mean reply tokens.")
    tokenizer: str = param("llama3", help="Tokenizer spec for the prompt text.")
    closed_loop: bool = param(False, help="Record think times for the engine's closed loop.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        from prefixlab.errors import ConfigError

        for name in ("open_share", "p_continue_open", "p_continue_closed"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be a probability in [0, 1], got {v}")


def _prompt(rng: np.random.Generator, is_open: bool) -> str:
    topic = list(TOPICS)[int(rng.integers(len(TOPICS)))]
    things = TOPICS[topic]
    thing = things[int(rng.integers(len(things)))]
    templates = OPEN_TEMPLATES if is_open else CLOSING_TEMPLATES
    text = templates[int(rng.integers(len(templates)))].format(thing=thing, topic=topic)
    return FILLERS[int(rng.integers(len(FILLERS)))] + text


@register_generator("lpc", LPCParams, "LPC text conversations with learnable continuation.")
def generate_lpc(params: LPCParams | None = None, **overrides: object) -> Trace:
    """Token-form conversations with ``prompt_text``, in arrival order."""
    p = resolve_params(LPCParams, params, overrides, "lpc")
    rng = np.random.default_rng(p.seed)
    tokens = TokenSource(p.seed, get_tokenizer(p.tokenizer).vocab_size)
    # 1. Structure and text: each prompt's kind decides whether another turn follows.
    convs: list[list[str]] = []
    for _ in range(p.num_conversations):
        texts: list[str] = []
        while True:
            is_open = bool(rng.random() < p.open_share)
            texts.append(_prompt(rng, is_open))
            go_on = p.p_continue_open if is_open else p.p_continue_closed
            if len(texts) >= p.max_turns or not rng.random() < go_on:
                break
        convs.append(texts)
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
