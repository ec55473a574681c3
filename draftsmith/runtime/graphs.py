"""A call captured in a CUDA graph: a round for one (rows, width) bucket, an admission for one
prefill width.

Every input and output of the captured call is a bind-time buffer, so a replay needs no copies
in or out; tensors created during capture live in the shared pool and are never read outside the
graph. The warm-up run before capture (lazy compilation, library handles, allocator growth) runs
the call on the buffers: the decoder resets them after capturing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class CapturedCall:
    """``fn`` warmed up on a side stream, captured into ``pool`` and replayed once;
    :meth:`replay` runs it.

    A graph's first launch uploads it to the device, which costs milliseconds for a round of
    hundreds of kernels; the replay here pays that while capturing, not in the first decoding
    step that uses the graph. ``fn`` therefore runs twice on the live buffers (warm-up and
    replay): callers capture only while no request is active and reset the state afterwards.
    """

    def __init__(self, fn: Callable[[], None], pool: object) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            fn()
        self.graph.replay()

    def replay(self) -> None:
        """Run the captured call."""
        self.graph.replay()


__all__ = ["CapturedCall"]
