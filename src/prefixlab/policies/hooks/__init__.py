"""The hooks of the array-state policies: jit functions over the state of
:mod:`prefixlab.policies._arrays`, one module per policy, each with its state layout.

The policy classes (:mod:`prefixlab.policies.arc` and the others) run them in batches and
the compiled replay and engine kernels one entry at a time, both through
:mod:`prefixlab.policies._dispatch`; nothing here imports a class.
"""
