"""Split-K scratch: the f32 workspace of partial tiles and the zeroed arrival counters (passes/split_k).

One pair per (device, stream): launches on one stream run in order, so they can share it; launches on two
streams at once cannot. The counters are zero between launches (each launch's last arrivals reset theirs),
so a pair serves every split-K kernel on its stream. It only grows; a launch takes the current pair (a Bound
launch asks again every call), and an outgrown pair is kept alive, not freed: a captured CUDA graph may hold
its addresses.

During a CUDA-graph capture each launch gets a pair of its own, allocated in the capture (from the graph's
memory pool) and not kept: the counters' zeroing is recorded in the graph and replays with it, and the pair is
freed when the call returns, as any temporary of the captured code. Keeping it would leave live tensors in the
pool that the graph's owner does not know of: ``torch.compile(mode="reduce-overhead")``'s cudagraph trees refuse
that ("tensor(s) in the cudagraph pool not tracked as outputs"; measured on the H200 with a split-K decode GEMM).
"""
from __future__ import annotations

import torch

_MIN_WS = 1 << 20      # f32 elements (4 MB): a 64x64-tile decode GEMM of N=16384 split 4 ways at 16 rows
_MIN_LOCKS = 1 << 14   # counters: output tiles of one launch

_pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_outgrown: list[tuple[torch.Tensor, torch.Tensor]] = []


def get(device_index: int, ws_elems: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace, counters) for the current stream of ``device_index`` with room for ``ws_elems`` f32 and
    ``tiles`` counters."""
    dev = torch.device("cuda", device_index)
    if torch.cuda.is_current_stream_capturing():
        return (torch.empty(ws_elems, device=dev, dtype=torch.float32),
                torch.zeros(tiles, device=dev, dtype=torch.int32))
    stream = torch._C._cuda_getCurrentRawStream(device_index)
    key = (device_index, stream)
    pair = _pairs.get(key)
    if pair is not None and pair[0].numel() >= ws_elems and pair[1].numel() >= tiles:
        return pair
    old_ws, old_locks = pair if pair is not None else (None, None)
    ws = old_ws if old_ws is not None and old_ws.numel() >= ws_elems else \
        torch.empty(max(ws_elems, _MIN_WS, 2 * (old_ws.numel() if old_ws is not None else 0)), device=dev,
                    dtype=torch.float32)
    locks = old_locks if old_locks is not None and old_locks.numel() >= tiles else \
        torch.zeros(max(tiles, _MIN_LOCKS), device=dev, dtype=torch.int32)
    if pair is not None:
        _outgrown.append(pair)
    _pairs[key] = (ws, locks)
    return ws, locks
