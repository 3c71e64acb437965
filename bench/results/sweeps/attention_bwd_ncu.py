"""The attention backward under Nsight Compute: one case's cuDNN backward and ours, each launched twice (the first
compiles and warms), so ncu can skip the first of each and profile the second (bench/results/sweeps/README.md,
"attention-bwd-ncu").

    ncu --clock-control none -k 'regex:attn_bwd_bf16|flash_bprop' --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \\
        --section Occupancy --section LaunchStats python bench/results/sweeps/attention_bwd_ncu.py 4096 64 0

Arguments: sequence length, head dim, causal (1 or 0); B*S = 16384 tokens, 2048 wide, bf16.
"""
import sys

import torch

from torch_autows.attention_grad import _cudnn_backward
from torch_autows.runtime import attention_bwd as rt
from torch_autows.sdpa_fallback import fused_attention


def main() -> None:
    s, d, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    B, H = 16384 // s, 2048 // d
    scale = d ** -0.5
    q, k, v, go = (torch.randn(B, H, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fused_attention("cudnn", q, k, v, causal, scale)
    for _ in range(2):
        _cudnn_backward(go, q, k, v, out, lse, causal, scale)
        rt.backward(go, None, q, k, v, out, lse, causal, scale)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
