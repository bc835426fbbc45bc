#!/bin/bash
# ncu on the logits kernels of the gap shapes: speed of light, warp stalls,
# occupancy. One kernel launch each (after the warm-ups).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=${LIBS:-$PWD/../dev-lib}:$LD_LIBRARY_PATH
NCU="ncu --clock-control none --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis"
i=0
for spec in "prefill fp8 4k:DenseLogitsWgmmaWsKernel" "decode fp8 B=64 next_n=2 n=32k:DenseLogitsWgmmaWsKernel" \
            "decode fp8 B=64 next_n=1 n=32k:DenseLogitsWgmmaWsKernel" "decode mxfp4 B=64 next_n=1 n=32k:Mxfp4" \
            "decode fp8 B=64 next_n=1 n=32k:CoopHistKernel|TopkRowKernel"; do
  shape=${spec%%:*}; kern=${spec#*:}; i=$((i+1))
  echo "== $shape ($kern)" | tee -a $OUT/ncu_summary.txt
  timeout 100 $NCU --kernel-name "regex:$kern" ./indexer_gpu_bench --only "$shape" --iters 2 > $OUT/ncu_$i.txt 2>&1
  grep -E "Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|Executed Ipc Active|SM Busy|No Eligible|Warp Cycles Per Issued|One or More Eligible|Stall|Tensor|Issued Warp" $OUT/ncu_$i.txt | head -40 | tee -a $OUT/ncu_summary.txt
done
