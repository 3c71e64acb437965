"""Split-K scratch: the f32 workspace of partial tiles and the zeroed arrival counters (passes/split_k).

Each launch gets a pair of its own, allocated by the call and freed when it returns, as Inductor does for its
kernels' workspaces: the caching allocator makes that an allocation and a small memset, and stream order keeps a
freed pair untouched until the launch that used it is done. A pair kept between calls (this module's first
form) is wrong under CUDA graphs: allocated while ``torch.compile(mode="reduce-overhead")``'s cudagraph trees
warm up or record (both route a thread's allocations into the graph's private pool), it stays alive in the pool
unknown to the graph's owner, which then refuses to record ("tensor(s) in the cudagraph pool not tracked as
outputs": the decode MLP at 64 rows on the H200). Per call, a captured launch's pair is a temporary of the capture,
its zeroing recorded with it.
"""
from __future__ import annotations

import torch


def get(device_index: int, ws_elems: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace, counters) for one launch on ``device_index``: ``ws_elems`` f32 (uninitialised: every partial is
    written before it is read) and ``tiles`` zeroed i32 counters (the launch's last arrivals reset them)."""
    dev = torch.device("cuda", device_index)
    return (torch.empty(max(ws_elems, 1), device=dev, dtype=torch.float32),
            torch.zeros(max(tiles, 1), device=dev, dtype=torch.int32))
