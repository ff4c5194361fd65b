"""A decoder-only language model from ``transformers`` (GPT-2 or Llama, random initialisation, nothing downloaded)
trained under DDP or FSDP2: an architecture outside the four built-in real ones, run through the same commands
(``bench/seeds_table.py --script bench/workloads/hf_decoder.py``) to see whether nbox lands as close on a model it
was not built around. Needs ``pip install transformers``; torch alone is not enough (this is a user's script, not
a shipped example).

    torchrun --nproc-per-node 2 bench/workloads/hf_decoder.py [--arch gpt2|llama] [--fsdp] [--steps N]
        [--report-times PATH]

Defaults: GPT-2 with 6 layers x 768 (82M parameters, vocabulary 50257), or Llama with 6 layers x 768 and an
untied head (about 92M); 2 sequences of 128 tokens per rank and step; AdamW.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist


def thread_times_ns() -> tuple[int, int] | None:
    """This thread's (time on a CPU, time runnable waiting for one) in ns (as the built-in examples write them
    with ``--report-times``: a launch slowed by another process on its core shows in the second)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            run_queue = f.read(256).split()[1]
        return time.thread_time_ns(), int(run_queue)
    except (OSError, ValueError, IndexError):
        return None


def build(arch: str, layers: int, hidden: int, heads: int, vocab: int) -> torch.nn.Module:
    """The model, from its configuration alone (random weights)."""
    import transformers

    if arch == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                                         n_positions=1024)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      num_key_value_heads=heads, intermediate_size=hidden * 8 // 3 // 64 * 64,
                                      vocab_size=vocab, max_position_embeddings=1024, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers (FSDP2 shards each, then the whole model)."""
    inner = getattr(model, "transformer", None) or model.model
    return list(getattr(inner, "h", None) or inner.layers)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=None, help="default: 50257 (gpt2), 32000 (llama)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per decoder layer) instead of DDP")
    p.add_argument("--report-times", default=None, metavar="PATH",
                   help="write this rank's iteration times (us) to PATH.rank<R> and each iteration's (on-CPU us, "
                        "run-queue us) to PATH.rank<R>.split, as JSON")
    args = p.parse_args(argv)
    vocab = args.vocab or (50257 if args.arch == "gpt2" else 32000)

    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = build(args.arch, args.layers, args.hidden, args.heads, vocab).to(device)
    wrapped: torch.nn.Module
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in blocks(model):
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(device) for _ in range(4)]

    times_us: list[float] = []
    split_us: list[tuple[float, float]] = []
    t_prev, tt_prev = None, None
    loss = torch.zeros(())
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        ids = batches[step % len(batches)]
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        now, tt = time.perf_counter(), thread_times_ns() if args.report_times else None
        if t_prev is not None:
            times_us.append((now - t_prev) * 1e6)
            if tt is not None and tt_prev is not None:
                split_us.append(((tt[0] - tt_prev[0]) / 1e3, (tt[1] - tt_prev[1]) / 1e3))
        t_prev, tt_prev = now, tt
    if args.steps and not math.isfinite(float(loss.detach())):
        raise FloatingPointError(f"hf_decoder: the loss is {float(loss.detach())}")
    if args.report_times:
        with open(f"{args.report_times}.rank{rank}", "w") as f:
            json.dump(times_us, f)
        with open(f"{args.report_times}.rank{rank}.split", "w") as f:
            json.dump(split_us, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
