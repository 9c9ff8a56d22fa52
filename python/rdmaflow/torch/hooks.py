"""DDP communication hooks that run each gradient bucket's allreduce through
one of rdmaflow's codecs (docs/compression.md), the way torch's
fp16_compress_hook and PowerSGD plug into DistributedDataParallel:

    from rdmaflow.torch import hooks
    state = hooks.CompressionState()             # error feedback lives here
    ddp.register_comm_hook(state, hooks.fp16_hook)
    ddp.register_comm_hook(state, hooks.topk_hook(0.01))   # or bf16_hook,
    # onebit_hook, qsgd_hook(127), codec_hook("onebit:256")

Ownership: the CompressionState passed to register_comm_hook owns the error
feedback (top-k's and 1-bit's residuals, qsgd's random state): one
CodecState per bucket index, created at the bucket's first allreduce, kept
for the model's training, replaced when the bucket changes size (DDP
rebuilds its buckets after the first iteration), dropped by reset() (call it
after re-initializing the model). One CompressionState per DDP model; the
hooks never keep state of their own.
"""
import rdmaflow.torch as rt
from rdmaflow import _C


class CompressionState:
    """Per-bucket codec states of one DDP model, and the group to run on
    (default: the default group, which must be an rdmaflow group)."""

    def __init__(self, process_group=None, seed=0):
        self.process_group = process_group
        self.seed = seed
        self._states = {}  # (codec, bucket index) -> (elements, CodecState)

    def state_for(self, codec, bucket):
        key = (codec, bucket.index())
        n = bucket.buffer().numel()
        held = self._states.get(key)
        if held is None or held[0] != n:
            rank = rt.group_of(self.process_group).rank()
            # qsgd draws per rank and per bucket: distinct seeds.
            seed = (self.seed * 1000003 + rank * 7919 + bucket.index() + 1) & (2**64 - 1)
            held = (n, _C.CodecState(seed))
            self._states[key] = held
        return held[1]

    def reset(self):
        """Drops every residual (e.g. after re-initializing the model)."""
        self._states.clear()


def codec_hook(codec):
    """A hook sending each bucket encoded by `codec` (any spelling
    docs/compression.md lists). ValueError here when the codec or its
    parameter is not valid."""
    spec = _C.check_codec(codec)

    def hook(state, bucket):
        if not isinstance(state, CompressionState):
            raise TypeError("rdmaflow hooks: register_comm_hook's state must be a "
                            f"rdmaflow.torch.hooks.CompressionState, not {type(state).__name__}")
        return rt.allreduce_compressed(bucket.buffer(), spec, state.state_for(spec, bucket),
                                       group=state.process_group)

    hook.__name__ = hook.__qualname__ = f"rdmaflow_{spec.replace(':', '_').replace('.', '_')}_hook"
    return hook


def topk_hook(ratio=0.01):
    """Top-k sparsification with error feedback: `ratio` of each bucket's
    entries (largest magnitudes) cross, in (0, 1]."""
    return codec_hook(f"topk:{_number(ratio, 'ratio')}")


def qsgd_hook(levels=127):
    """QSGD stochastic quantization with `levels` per sign (a whole number in [1, 127])."""
    return codec_hook(f"qsgd:{_number(levels, 'levels')}")


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"rdmaflow hooks: {name} must be a number, not {value!r}")
    return repr(value)


fp16_hook = codec_hook("fp16")
bf16_hook = codec_hook("bf16")
onebit_hook = codec_hook("onebit")

__all__ = ["CompressionState", "codec_hook", "fp16_hook", "bf16_hook", "topk_hook",
           "onebit_hook", "qsgd_hook"]
