"""Truth of the loop-marks captures (tests/fixtures/loops, README there: one H200, loops with no
NVTX of their own, orch's loop marks on unless said): the optimizer steps counted by plain
sqlite3 (clip_grad_norm_'s one `lpnorm_cleanup` kernel a step), what giving a slow dataset 8
DataLoader workers saves and what taking the masking out of the masking loop saves, from the
same loop's own unprofiled timings on the same machine (timings.json: each `--repeat 3` run's
steady step time, the median taken)."""

from __future__ import annotations

import itertools
import json
import sqlite3
import statistics
import tempfile
from pathlib import Path

from tests.truth import FIXTURES, Truth, opened

LOOPS = FIXTURES / "loops"
STEPS = ("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
         "WHERE s.value = 'lpnorm_cleanup'")
HOW = {
    "root": "planted: the workload's arguments (loops/README.md); a single process is rank 0",
    "steps": "plain sqlite3: optimizer steps, one `lpnorm_cleanup` kernel each (clip_grad_norm_)",
    "saving_ms": "the loop's own unprofiled timings (timings.json, median of 3 runs each): (steady step at "
                 "{slow} - at {fast}) x the {n} steps after the first",
    "saving_ckpt": "the loop's own unprofiled timings (timings.json, median of 3 runs each): (steady step at {slow} "
                   "- at {fast}) x the {n} timed steps over the {c} checkpoints among them = {per} ms a checkpoint, x "
                   "the {a} checkpoints between the first and the last optimizer step (the steps after the first, "
                   "counted between optimizer steps; plain sqlite3 finds them as bursts of 231 "
                   "cudaStreamSynchronize, torch.save's copy of each state tensor to the host; the checkpoint after "
                   "the last optimizer step is past the last step)",
    "saving_epochs": "the loop's own unprofiled timings (timings.json, median of 3 runs each): (steady step at "
                     "{slow} - at {fast}) x the {n} timed steps over the {c} epoch starts among them = {per} ms an "
                     "epoch start, x the {a} epoch starts in the steps after the first (one every {k} optimizer steps, "
                     "before the step's first batch)",
    "saving_pair": "plain sqlite3 over both captures (the same device call): from the first `orch: optimizer.step` "
                   "range's end to the last's ({n} steps), minus {fast}'s",
    "saving_shapes": "plain sqlite3 over both captures (the same device call): the steps from one `orch: "
                     "optimizer.step` range's end to the next ({n} steps), summed, minus {fast}'s, both without step "
                     "{skip}, the one step over 10x its capture's median ({slow_ms} ms against {med} ms): Dynamo "
                     "compiling the model again for a dynamic sequence length, once a run, which padding to a "
                     "multiple of 64 pays too when its second length first comes{why_pair}",
    # the first varlen call's timings (timings.json), three runs in one process each
    "shapes_one_process": " (its own timing run 2: {again} ms a step against {once} and {thrice}; timings.json). The "
                          "unprofiled timings cannot give the saving: the first timing run compiled Triton's kernels "
                          "for each new length cold (61.1 ms a step; the capture, run after it, 27.8 by its own "
                          "timer) and the later runs had most lengths recorded already",
    "saving_steps": "the loops' own unprofiled step times (step_times.json: {p} processes of one run each on the "
                    "capture's machine, each step's time from one optimizer step's return to the next's, as the "
                    "capture's loop marks time them): the median over the warm processes (the 2nd on; the 1st "
                    "compiles Triton's kernels cold) of the steps summed without step {skip}, {slow} minus {fast}: "
                    "{slows} ms against {fasts} ms",
    "cause": "{what}",
    "function": "planted: the function the workload calls {where}; unprofiled it takes {ms} ms a step "
                "(timings.json, median of 3), the step {slow} ms against {fast} ms without it",
}
# stem -> (about, cause, root, (slow timing, fast timing) or None, how the cause is known)
CASES = {
    "loops_fused_accum4": (
        "modern_loops.py's eager GPT with fused AdamW and 4 micro-batches of gradient accumulation per optimizer "
        "step, 20 optimizer steps, no NVTX; orch's loop marks on; nothing planted, launch-bound", "launch", [0], None,
        "the eager GPT is launch-bound (nothing planted for it), as modern-gpt_eager_accum4"),
    "loops_fused_accum4_nomarks": (
        "loops_fused_accum4 with profile.loop_marks: false (no marks: steps only inferred); nothing planted, "
        "launch-bound", "launch", [0], None, "the same loop as loops_fused_accum4"),
    "loops_tokenise_w0": (
        "modern_loops.py's eager GPT, each sample tokenised in Python for 5 ms (--sample-ms 5) by a DataLoader "
        "with num_workers=0, 20 optimizer steps, no NVTX; orch's loop marks on", "input", [0],
        ("loops_tokenise_w0", "loops_tokenise_w8"), "planted: --sample-ms 5 --workers 0"),
    "loops_tokenise_w2": (
        "modern_loops.py's eager GPT, each sample tokenised in Python for 5 ms (--sample-ms 5) by a DataLoader "
        "with num_workers=2, 20 optimizer steps, no NVTX; orch's loop marks on", "input", [0],
        ("loops_tokenise_w2", "loops_tokenise_w8_rerun"), "planted: --sample-ms 5 --workers 2"),
    "loops_tokenise_w8": (
        "loops_tokenise_w2's loop with num_workers=8, which keep the next batch ready; nothing planted, "
        "launch-bound", "launch", [0], None,
        "the eager GPT is launch-bound (nothing planted for it), as graphs-gpt_eager_nvtx measured against its "
        "twin replayed as one CUDA graph"),
    "hf_gpt2_accum4": (
        "GPT-2 small from scratch with the HF Trainer (transformers 5), bf16, 4 micro-batches of gradient "
        "accumulation, 2 DataLoader workers, 20 optimizer steps; orch's loop marks on; nothing planted", "none", [],
        None, "nothing planted"),
    "hf_gpt2_tokenise_w0": (
        "the HF Trainer's GPT-2 with each sample tokenised in Python for 5 ms and dataloader_num_workers=0, "
        "1 micro-batch a step, 20 optimizer steps; orch's loop marks on", "input", [0],
        ("hf_tokenise_w0", "hf_tokenise_w8"), "planted: --sample-ms 5 --workers 0"),
    "loops_mask": (
        "a 2-layer GPT whose training loop masks every batch of 32 x 512 tokens BERT-style in Python on the host "
        "(--mask) before copying it to the GPU, 2 DataLoader workers, 100 optimizer steps, no NVTX; orch's loop "
        "marks and Python samples on", "cpu", [0], ("loops_mask", "loops_nomask"), "planted: --mask"),
    "lightning_gpt_accum4": (
        "modern_loops.py's eager GPT trained with PyTorch Lightning (bf16-mixed, accumulate_grad_batches=4, "
        "gradient_clip_val=1.0, 2 DataLoader workers), 20 optimizer steps, no NVTX; orch's loop marks on; nothing "
        "planted, launch-bound", "launch", [0], None,
        "the eager GPT is launch-bound (nothing planted for it), as loops-loops_fused_accum4"),
    "accelerate_gpt_accum4": (
        "modern_loops.py's eager GPT in an Accelerate loop (Accelerator(gradient_accumulation_steps=4), "
        "`accumulate`, `clip_grad_norm_`, 2 DataLoader workers), 20 optimizer steps, no NVTX; orch's loop marks and "
        "Python samples on; nothing planted, launch-bound", "launch", [0], None,
        "the eager GPT is launch-bound (nothing planted for it), as loops-loops_fused_accum4"),
    "loops_compile_ro": (
        "modern_loops.py's GPT compiled with torch.compile(mode='reduce-overhead') (CUDA graphs), clip_grad_norm_ "
        "and AdamW eager, 40 optimizer steps, no NVTX; orch's loop marks and Python samples on; nothing planted",
        "none", [], None, "nothing planted"),
    "loops_ckpt5": (
        "modern_loops.py's eager GPT saving a checkpoint (model and AdamW state dicts, torch.save from the loop, "
        "as most train.py files do) every 5 optimizer steps, 2 DataLoader workers, 40 optimizer steps, no NVTX; "
        "orch's loop marks and Python samples on", "cpu", [0], ("loops_ckpt5", "loops_nockpt"),
        "planted: --ckpt-every 5"),
    "loops_ckpt10": (
        "loops_ckpt5's loop saving its checkpoint every 10 optimizer steps", "cpu", [0],
        ("loops_ckpt10", "loops_nockpt"), "planted: --ckpt-every 10"),
    "loops_epochs_np": (
        "modern_loops.py's eager GPT over a dataset of 8 optimizer steps an epoch, 4 DataLoader workers without "
        "persistent_workers (they start anew every epoch, as a DataLoader's default does), 40 optimizer steps, no "
        "NVTX; orch's loop marks and Python samples on", "input", [0], ("loops_epochs_np", "loops_epochs_p"),
        "planted: --epoch-steps 8 --workers 4 --no-persistent"),
    "loops_epochs_p": (
        "loops_epochs_np's loop with persistent_workers=True (the same 4 workers serve every epoch); nothing "
        "planted, launch-bound", "launch", [0], None,
        "the eager GPT is launch-bound (nothing planted for it), as graphs-gpt_eager_nvtx measured against its "
        "twin replayed as one CUDA graph"),
    "hf_epochs_np": (
        "GPT-2 small from scratch with the HF Trainer (transformers 5), bf16, 1 micro-batch a step, over a dataset "
        "of 4 optimizer steps an epoch, dataloader_num_workers=4 with the Trainer's default "
        "dataloader_persistent_workers=False, 24 optimizer steps; orch's loop marks and Python samples on", "input",
        [0], ("hf_epochs_np", "hf_epochs_p"), "planted: --epoch-steps 4 --workers 4 --no-persistent"),
    "hf_epochs_p": (
        "hf_epochs_np's Trainer with dataloader_persistent_workers=True; nothing planted", "none", [], None,
        "nothing planted"),
    "hf_fp16": (
        "GPT-2 small from scratch with the HF Trainer (transformers 5), fp16=True: the Trainer's GradScaler, whose "
        "step reads found_inf from the GPU, 1 micro-batch a step, 2 DataLoader workers, 30 optimizer steps; orch's "
        "loop marks on; nothing planted (plain sqlite3: 7.5 cudaStreamSynchronize and 3.2 device-to-host copies a "
        "step, against 8.2 and 3.3 in hf_epochs_p's bf16 Trainer: the Trainer syncs the host every step either way)",
        "none", [], None,
        "nothing planted: fp16 as the Trainer's documentation writes it"),
    "hf_fp16_accum4": (
        "hf_fp16's Trainer with 4 micro-batches of gradient accumulation, 20 optimizer steps; nothing planted",
        "none", [], None, "nothing planted: fp16 as the Trainer's documentation writes it"),
    "loops_logstep_b32": (
        "modern_loops.py's eager GPT at batch 32 (its CPU's launches and its GPU's work a step about even), 2 "
        "DataLoader workers, printing `loss.item()` after every optimizer step (--log-every 1), 40 optimizer steps, "
        "no NVTX; orch's loop marks and Python samples on", "host-sync", [0],
        ("loops_logstep_b32", "loops_log10_b32"), "planted: --log-every 1 (a host sync every step)"),
    "loops_log10_b32": (
        "loops_logstep_b32's loop printing the loss every 10 steps (--log-every 10); nothing planted", "none", [],
        None, "nothing planted"),
    "resnet18_logstep": (
        "modern_loops.py's torchvision ResNet-18 at batch 64 of 224x224 images (the GPU's work the larger), 4 "
        "DataLoader workers, printing `loss.item()` after every optimizer step (--log-every 1), 30 optimizer steps, "
        "no NVTX; orch's loop marks and Python samples on", "host-sync", [0],
        ("resnet18_logstep", "resnet18_log10"), "planted: --log-every 1 (a host sync every step)"),
    "resnet18_log10": (
        "resnet18_logstep's loop printing the loss every 10 steps (--log-every 10); nothing planted", "none", [], None,
        "nothing planted"),
    "resnet18_logstep_rerun": (
        "resnet18_logstep's loop captured again in a later device call on another H100, each twin timed right "
        "before its capture", "host-sync", [0], None,
        "planted: --log-every 1 (a host sync every step); what it saves is not measured in this call: without the "
        "profiler the twin logging every 10 steps ran the slower (20.061 against 18.798 ms a step, medians of 3 "
        "whose runs spread over 1.5-1.7 ms), and under the profiler the pair's captures are 21.0 ms apart over 29 "
        "steps whose times spread from 10.8 to 38.4 ms (plain sqlite3)"),
    "resnet18_log10_rerun": (
        "resnet18_log10's loop captured again in the same call as resnet18_logstep_rerun; nothing planted", "none",
        [], None, "nothing planted"),
    "loops_varlen_ro": (
        "modern_loops.py's GPT compiled with torch.compile(mode='reduce-overhead') over documents of 32 to 256 "
        "tokens, each batch padded to its longest (as DataCollatorWithPadding does): a new sequence length, so a new "
        "CUDA graph to warm up and record, at most steps; 40 optimizer steps, no NVTX; orch's loop marks and Python "
        "samples on", "graph-shapes", [0], ("loops_varlen_ro", "loops_varlen_ro_pad64"),
        "planted: --min-seq 32 (each batch padded to its own longest); torch's own warning in the timing run: "
        "'CUDAGraph supports dynamic shapes by recording a new graph for each distinct input size'"),
    "loops_varlen_ro_pad64": (
        "loops_varlen_ro's loop with each batch padded to a multiple of 64 (pad_to_multiple_of=64): 192 or 256 "
        "tokens, 256 in every batch of this capture; nothing planted", "none", [], None, "nothing planted"),
    "loops_varlen_ro_rerun": (
        "loops_varlen_ro's loop captured again in a later device call on another H100, each loop also timed step "
        "by step without the profiler in 3 processes of its own", "graph-shapes", [0],
        ("loops_varlen_ro_rerun", "loops_varlen_ro_pad64_rerun"),
        "planted: --min-seq 32 (each batch padded to its own longest); torch's own warning in the timing runs: "
        "'CUDAGraph supports dynamic shapes by recording a new graph for each distinct input size'"),
    "loops_varlen_ro_pad64_rerun": (
        "loops_varlen_ro_pad64's loop captured again in the same call as loops_varlen_ro_rerun; nothing planted",
        "none", [], None, "nothing planted"),
    "resnet18_decode_w2": (
        "modern_loops.py's torchvision ResNet-18 at batch 64 of 224x224 images whose dataset spends 0.75 ms in "
        "Python on each image (JPEG decoding and augmentation in __getitem__, --sample-ms 0.75), 2 DataLoader "
        "workers, 30 optimizer steps, no NVTX; orch's loop marks and Python samples on", "input", [0],
        ("resnet18_decode_w2", "resnet18_decode_w8"), "planted: --workers 2 --sample-ms 0.75"),
    "resnet18_decode_w8": (
        "resnet18_decode_w2's loop with 8 DataLoader workers, which keep up; nothing planted", "none", [], None,
        "nothing planted"),
    "resnet18_decode_w0": (
        "modern_loops.py's torchvision ResNet-18 at batch 64 of 224x224 images whose dataset spends 0.25 ms in "
        "Python on each image (--sample-ms 0.25), DataLoader num_workers=0: the loop thread decodes every batch "
        "itself; 30 optimizer steps, no NVTX; orch's loop marks and Python samples on", "input", [0],
        ("resnet18_decode_w0", "resnet18_decode_w0_w8"), "planted: --workers 0 --sample-ms 0.25"),
    "resnet18_decode_w0_w8": (
        "resnet18_decode_w0's loop with 8 DataLoader workers, which keep up; nothing planted", "none", [], None,
        "nothing planted"),
    "resnet18_decode_w2_rerun": (
        "resnet18_decode_w2's loop captured again in a later device call on another H100", "input", [0],
        ("resnet18_decode_w2_rerun", "resnet18_decode_w8_rerun"), "planted: --workers 2 --sample-ms 0.75"),
    "resnet18_decode_w8_rerun": (
        "resnet18_decode_w8's loop captured again in the same call as resnet18_decode_w2_rerun; nothing planted",
        "none", [], None, "nothing planted"),
    "resnet18_decode_w0_rerun": (
        "resnet18_decode_w0's loop captured again in the same call as resnet18_decode_w2_rerun", "input", [0],
        ("resnet18_decode_w0_rerun", "resnet18_decode_w0_w8_rerun"), "planted: --workers 0 --sample-ms 0.25"),
    "resnet18_decode_w0_w8_rerun": (
        "resnet18_decode_w0_w8's loop captured again in the same call as resnet18_decode_w2_rerun; nothing planted",
        "none", [], None, "nothing planted"),
    "resnet18_nopin_w2": (
        "modern_loops.py's torchvision ResNet-18 at batch 64 of 224x224 images, 2 DataLoader workers, "
        "DataLoader(pin_memory=False) and a blocking .to(device): each batch's 38.5 MB copied to the GPU from "
        "pageable memory (--no-pin); 30 optimizer steps, no NVTX; orch's loop marks and Python samples on",
        "pageable-copy", [0], ("resnet18_nopin_w2", "resnet18_pin_w2"),
        "planted: --no-pin (plain sqlite3: {n} host-to-device copies from pageable memory in the steps after the "
        "first, {mib:,.1f} MiB in {ms:,.1f} ms; the twin's {twin_n} from pinned memory, {twin_mib:,.1f} MiB, take "
        "{twin_ms:,.1f} ms)"),
    "resnet18_pin_w2": (
        "resnet18_nopin_w2's loop with pinned batches and non_blocking copies (pin_memory=True, the fix); its 2 "
        "workers, each now also pinning a batch, then keep the GPU waiting", "input", [0], None,
        "nothing planted, and the loop waits for its input: plain sqlite3 puts {idle:,.1f} ms of GPU idle ({pct:.1f} % "
        "of the {window:,.1f} ms from the first optimizer step's end to the last's) inside the loop thread's {n} "
        "`orch: next batch` waits ({waits:,.1f} ms in all, against {twin_waits:,.1f} ms with {twin_idle:,.1f} ms of "
        "GPU idle in its pageable twin); no fix of that was timed"),
    "gpt_compile_default_b4": (
        "modern_loops.py's GPT compiled as most code compiles it, torch.compile(model) (Inductor's default mode, "
        "no CUDA graphs), at batch 4 x 256 tokens, clip_grad_norm_ and AdamW eager, 40 optimizer steps, no NVTX; "
        "orch's loop marks and Python samples on", "launch", [0], ("gpt_compile_default_b4", "gpt_compile_ro_b4"),
        "measured: the same loop compiled with mode='reduce-overhead' (CUDA graphs replay the compiled kernels, "
        "launched at once) runs 4.257 ms a step against 12.151 (timings.json, medians of 3, the same call); "
        "nothing else differs"),
    "gpt_compile_ro_b4": (
        "gpt_compile_default_b4's loop compiled with torch.compile(model, mode='reduce-overhead'): CUDA graphs; "
        "nothing planted", "none", [], None, "nothing planted"),
    "gpt_compile_breaks_b4": (
        "gpt_compile_default_b4's loop with a graph break in every block's forward (torch._dynamo.graph_break(), "
        "as a call torch.compile cannot trace makes one), compiled with Inductor's default mode", "launch", [0],
        None, "measured: the breaks cost nothing the timings tell apart (12.350 ms a step against 12.151 without "
        "them; its runs 10.269-12.783, timings.json, the same call), and the loop without them is launch-bound "
        "(its twin with CUDA graphs runs 4.257): the loop with them is launch-bound as it is. No fix was timed "
        "on it, so no saving"),
    "hf_gpt2_compile_b2": (
        "GPT-2 small from scratch with the HF Trainer (transformers 5) compiled by the Trainer itself, "
        "TrainingArguments(torch_compile=True) (Inductor's default mode), bf16, batch 2 x 256 tokens, 1 micro-batch "
        "a step, 2 DataLoader workers, 30 optimizer steps; orch's loop marks and Python samples on", "launch", [0],
        ("hf_gpt2_compile_b2", "hf_gpt2_compile_ro_b2"),
        "measured: the same Trainer with torch_compile_mode='reduce-overhead' (CUDA graphs) runs 14.180 ms a step "
        "against 28.061 (timings.json, medians of 3, the same call); nothing else differs"),
    "hf_gpt2_compile_ro_b2": (
        "hf_gpt2_compile_b2's Trainer with torch_compile_mode='reduce-overhead': CUDA graphs; nothing planted",
        "none", [], None, "nothing planted"),
}
# Checkpointing loops: every k optimizer steps, after the step ((step + 1) % k == 0); their
# timings leave out the first WARMUP steps (modern_loops.py --warmup) and hold the last step's.
CKPT_EVERY = {"loops_ckpt5": 5, "loops_ckpt10": 10}
# Loops over a dataset of k optimizer steps an epoch: each epoch from the k-th step on starts its
# batches (and, without persistent workers, its workers) before that step's first batch. With k,
# the first step the workload's own timer counts: modern_loops.py times the steps from its 5
# warm-up steps on, hf_trainer.py from the end of the 6th optimizer step.
WARMUP = 5
# Loops that record a CUDA graph for each new input shape, measured against their padded twin.
SHAPES = ("loops_varlen_ro", "loops_varlen_ro_rerun")
EPOCH_STEPS = {"loops_epochs_np": (8, WARMUP), "hf_epochs_np": (4, 6)}
# Pairs measured both ways: the captures' difference, and the loops' own unprofiled timings.
BOTH_WAYS = ("resnet18_decode_w2", "resnet18_decode_w0", "resnet18_decode_w2_rerun", "resnet18_decode_w0_rerun",
             "gpt_compile_default_b4", "hf_gpt2_compile_b2", "resnet18_nopin_w2")
# The Python function a case's time goes in (planted), its own unprofiled time a step, and where
# the workload calls it.
_AFTER_STEP = "after the optimizer step every {k} steps (modern_loops.py --ckpt-every {k})"
FUNCTIONS = {
    "loops_mask": ("mask_tokens", "loops_mask_tokens_ms",
                   "between taking a batch and copying it to the GPU (modern_loops.py --mask)"),
    "loops_ckpt5": ("save_checkpoint", "loops_ckpt5_save_ms", _AFTER_STEP.format(k=5)),
    "loops_ckpt10": ("save_checkpoint", "loops_ckpt10_save_ms", _AFTER_STEP.format(k=10)),
}


def opt_step_ms(con: sqlite3.Connection) -> list[float]:
    """ms from each optimizer step's end (orch's loop mark) to the next's, in order."""
    ends = [e for (e,) in con.execute("SELECT e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                      "WHERE coalesce(e.text, s.value) = 'orch: optimizer.step' ORDER BY e.\"end\"")]
    return [(b - a) / 1e6 for a, b in itertools.pairwise(ends)]


def opt_window(con: sqlite3.Connection) -> tuple[int, int]:
    """(the end of the first optimizer step (orch's loop mark), the end of the last), ns."""
    return con.execute("SELECT min(e.\"end\"), max(e.\"end\") FROM NVTX_EVENTS e LEFT JOIN StringIds s ON "
                       "s.id = e.textId WHERE coalesce(e.text, s.value) = 'orch: optimizer.step'").fetchone()


def opt_span_ms(con: sqlite3.Connection) -> float:
    """ms from the end of the first optimizer step (orch's loop mark) to the end of the last."""
    a, b = opt_window(con)
    return (b - a) / 1e6


# The pinned-memory pair: (pageable loop, pinned twin); their causes' figures are measured below.
COPY_PAIR = ("resnet18_nopin_w2", "resnet18_pin_w2")
_HTOD = ("SELECT count(*), coalesce(sum(m.bytes), 0) / 1048576.0, coalesce(sum(m.\"end\" - m.start), 0) / 1e6 "
         "FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER k ON k.id = m.copyKind "
         "JOIN ENUM_CUDA_MEM_KIND s ON s.id = m.srcKind WHERE k.name = 'CUDA_MEMCPY_KIND_HTOD' "
         "AND s.name = ? AND m.start >= ? AND m.\"end\" <= ?")
_WAITS = ("SELECT e.start, e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
          "WHERE coalesce(e.text, s.value) = 'orch: next batch' AND e.start >= ? AND e.\"end\" <= ? ORDER BY 1")
_GPU = ("SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, \"end\" FROM "
        "CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY 1")


def _htod(con: sqlite3.Connection, kind: str) -> tuple[int, float, float]:
    """Host-to-device copies from `kind` memory after the first optimizer step: count, MiB, ms."""
    n, mib, ms = con.execute(_HTOD, [kind, *opt_window(con)]).fetchone()
    return n, mib, ms


def _input_waits(con: sqlite3.Connection) -> tuple[int, float, float]:
    """The loop's waits for a batch after the first optimizer step (orch's `orch: next batch`
    marks): count, ms in all, and ms of them in which the GPU ran nothing."""
    waits = con.execute(_WAITS, list(opt_window(con))).fetchall()
    busy: list[list[int]] = []
    for a, b in con.execute(_GPU):
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], b)
        else:
            busy.append([a, b])
    idle = sum((e - s) - sum(max(0, min(b, e) - max(a, s)) for a, b in busy) for s, e in waits)
    return len(waits), sum(e - s for s, e in waits) / 1e6, idle / 1e6


def _copy_facts(stem: str, tmp: Path) -> dict:
    """What the pinned-memory pair's truth says of `stem` (its `why`'s fields), by plain sqlite3."""
    with opened(_spec(COPY_PAIR[0]), tmp) as slow, opened(_spec(COPY_PAIR[1]), tmp) as fast:
        if stem == COPY_PAIR[0]:
            (n, mib, ms), (tn, tmib, tms) = _htod(slow[0], "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE"), _htod(
                fast[0], "CUDA_MEMOPR_MEMORY_KIND_PINNED")
            return {"n": n, "mib": mib, "ms": ms, "twin_n": tn, "twin_mib": tmib, "twin_ms": tms}
        (n, waits, idle), (_, twin_waits, twin_idle) = _input_waits(fast[0]), _input_waits(slow[0])
        window = opt_span_ms(fast[0])
        return {"n": n, "waits": waits, "idle": idle, "window": window, "pct": 100 * idle / window,
                "twin_waits": twin_waits, "twin_idle": twin_idle}


def _spec(stem: str) -> dict:
    """The truth's input: the loop `stem`'s export in tests/fixtures/loops."""
    return {"exports": [f"loops/{next(LOOPS.glob(f'{stem}_r0_*.sqlite.xz')).name}"]}


def _pair_ms(spec: dict, fast: str, tmp: Path) -> float:
    """The pair's measured difference under the profiler: `spec`'s optimizer steps' span less its
    twin `fast`'s (both captured the same way in the same device call)."""
    with opened(spec, tmp) as cons, opened(_spec(fast), tmp) as others:
        return round(opt_span_ms(cons[0]) - opt_span_ms(others[0]), 1)


def cases() -> list[Truth]:
    timings = {k: statistics.median(v) for k, v in json.loads((LOOPS / "timings.json").read_text()).items()}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem, (about, cause, root, pair, why) in CASES.items():
            spec = _spec(stem)
            with opened(spec, Path(tmp)) as cons:
                (con,) = cons.values()
                steps = con.execute(STEPS).fetchone()[0]
            if stem in COPY_PAIR:
                why = why.format(**_copy_facts(stem, Path(tmp)))
            t = Truth(case=f"loops-{stem}", about=about, input=spec, cause=cause, root=root, steps=steps,
                      how={"root": HOW["root"], "steps": HOW["steps"], "cause": HOW["cause"].format(what=why)})
            if pair and stem in CKPT_EVERY:
                k, slow, fast = CKPT_EVERY[stem], *pair
                timed = [i for i in range(WARMUP, steps) if (i + 1) % k == 0]
                # The steps are counted between optimizer steps: the checkpoint after the last
                # one (i = steps - 1) is past the last analysed step.
                analysed = [i for i in range(steps - 1) if (i + 1) % k == 0]
                per_ckpt = (timings[slow] - timings[fast]) * (steps - WARMUP) / len(timed)
                t.saving_ms = round(per_ckpt * len(analysed), 1)
                t.how["saving_ms"] = HOW["saving_ckpt"].format(slow=slow, fast=fast, n=steps - WARMUP, c=len(timed),
                                                               per=round(per_ckpt, 1), a=len(analysed))
            elif pair and stem in EPOCH_STEPS:
                (k, first), (slow, fast) = EPOCH_STEPS[stem], pair
                timed = [i for i in range(first, steps) if i % k == 0]
                # orch's step i runs from optimizer step i - 1's end: an epoch begun before step i's
                # first batch is in it; the steps after the first are analysed.
                analysed = [i for i in range(1, steps) if i % k == 0]
                per_epoch = (timings[slow] - timings[fast]) * (steps - first) / len(timed)
                t.saving_unprofiled_ms = round(per_epoch * len(analysed), 1)
                t.how["saving_unprofiled_ms"] = HOW["saving_epochs"].format(
                    slow=slow, fast=fast, n=steps - first, c=len(timed), per=round(per_epoch, 1), a=len(analysed), k=k)
                # Both loops were captured the same way in the same device call: the pair's measured
                # difference under the profiler.
                t.saving_ms = _pair_ms(spec, fast, Path(tmp))
                t.how["saving_ms"] = HOW["saving_pair"].format(fast=fast, n=steps - 1)
            elif pair and stem in SHAPES:
                slow, fast = pair
                with opened(spec, Path(tmp)) as cons, opened(_spec(fast), Path(tmp)) as others:
                    mine, theirs = opt_step_ms(cons[0]), opt_step_ms(others[0])
                med = statistics.median(mine)
                (skip,) = [i for i, ms in enumerate(mine) if ms > 10 * med]
                t.saving_ms = round(sum(mine) - mine[skip] - (sum(theirs) - theirs[skip]), 1)
                per_step = json.loads((LOOPS / "step_times.json").read_text())
                if slow in per_step:
                    why_pair = ""
                    slows, fasts = ([sum(run) - run[skip] for run in per_step[x][1:]] for x in (slow, fast))
                    t.saving_unprofiled_ms = round(statistics.median(slows) - statistics.median(fasts), 1)
                    t.how["saving_unprofiled_ms"] = HOW["saving_steps"].format(
                        p=len(per_step[slow]), skip=skip + 1, slow=slow, fast=fast,
                        slows=", ".join(f"{x:.1f}" for x in slows), fasts=", ".join(f"{x:.1f}" for x in fasts))
                else:
                    once, again, thrice = json.loads((LOOPS / "timings.json").read_text())[fast]
                    why_pair = HOW["shapes_one_process"].format(again=again, once=once, thrice=thrice)
                t.how["saving_ms"] = HOW["saving_shapes"].format(
                    n=len(mine), fast=fast, skip=skip + 1, slow_ms=round(mine[skip], 1), med=round(med, 1),
                    why_pair=why_pair)
            elif pair and stem in BOTH_WAYS:
                slow, fast = pair
                t.saving_unprofiled_ms = round((timings[slow] - timings[fast]) * (steps - 1), 1)
                t.how["saving_unprofiled_ms"] = HOW["saving_ms"].format(slow=slow, fast=fast, n=steps - 1)
                t.saving_ms = _pair_ms(spec, fast, Path(tmp))
                t.how["saving_ms"] = HOW["saving_pair"].format(fast=fast, n=steps - 1)
            elif pair:
                slow, fast = pair
                t.saving_ms = round((timings[slow] - timings[fast]) * (steps - 1), 1)
                t.how["saving_ms"] = HOW["saving_ms"].format(slow=slow, fast=fast, n=steps - 1)
            if stem in FUNCTIONS:
                t.function, own, where = FUNCTIONS[stem]
                t.how["function"] = HOW["function"].format(where=where, ms=timings[own], slow=timings[pair[0]],
                                                           fast=timings[pair[1]])
            out.append(t)
    return out
