"""Built-in example workloads for ``nbox record`` (used when no script is given).

Each module is a plain, self-contained training script that runs unchanged under torchrun, with or
without nbox::

    python -m torch.distributed.run --nproc-per-node 2 nbox_record/examples/ddp_mlp.py --steps 20

* :mod:`~nbox_record.examples.ddp_convnet`: DDP over a small ConvNet on 32x32 images (the default: an iteration of
  100-300 ms on a core per rank, so that a launch's noise is small beside it);
* :mod:`~nbox_record.examples.ddp_mlp`: DDP over a 3-layer MLP (SGD, MSE, random data; a few milliseconds);
* :mod:`~nbox_record.examples.ddp_transformer`: DDP over one transformer block;
* :mod:`~nbox_record.examples.fsdp2_transformer`: FSDP2 (``fully_shard``) over two transformer blocks,
  so all-gathers and reduce-scatters appear;
* :mod:`~nbox_record.examples.tp_dp_mlp`: tensor parallel x data parallel on a 2-D device mesh
  (``dp`` x ``tp``, tp = 2 by default, dp = world / tp): DTensor column/row-wise MLP blocks on tp, a
  gradient all-reduce on dp. Run it on 4 ranks for dp=2 x tp=2.

Real architectures (full size by default, an iteration of seconds on one CPU core; ``--layers`` and width flags
make a tiny one; DDP, and ``--fsdp`` for FSDP2 in bert, resnet152 and t5; docs/models.md):

* :mod:`~nbox_record.examples.bert`: BERT-base masked LM (``transformers`` when importable, else plain torch);
* :mod:`~nbox_record.examples.resnet152`: ResNet-152 image classification (``torchvision`` when importable, else
  plain torch);
* :mod:`~nbox_record.examples.t5`: T5-base sequence to sequence (``transformers`` when importable, else plain torch);
* :mod:`~nbox_record.examples.deeplight`: DeepLight's DeepFwFM CTR model over Criteo-shaped fields (plain torch).

All of them: backend from ``NBOX_BACKEND`` (default ``gloo``, or ``cpu:gloo,cuda:nccl`` when CUDA is
available), model seeded identically on every rank and data seeded per rank, no output per step,
``--steps`` iterations (default 20). Each exposes ``build_model()`` so tests can compute the expected
collective sizes from the very same definition. They import nothing from nbox.
"""

from __future__ import annotations

from pathlib import Path

#: Example name -> script file, as ``nbox record`` offers them.
EXAMPLES_DIR = Path(__file__).resolve().parent
EXAMPLES: dict[str, Path] = {
    "ddp_convnet": EXAMPLES_DIR / "ddp_convnet.py",
    "ddp_mlp": EXAMPLES_DIR / "ddp_mlp.py",
    "ddp_transformer": EXAMPLES_DIR / "ddp_transformer.py",
    "fsdp2_transformer": EXAMPLES_DIR / "fsdp2_transformer.py",
    "tp_dp_mlp": EXAMPLES_DIR / "tp_dp_mlp.py",
    "bert": EXAMPLES_DIR / "bert.py",
    "resnet152": EXAMPLES_DIR / "resnet152.py",
    "t5": EXAMPLES_DIR / "t5.py",
    "deeplight": EXAMPLES_DIR / "deeplight.py",
}
#: The real-architecture examples (docs/models.md).
MODEL_EXAMPLES = ("bert", "resnet152", "t5", "deeplight")
#: The example ``nbox record`` runs when no script is given.
DEFAULT_EXAMPLE = "ddp_convnet"
