"""``drmlab train`` reads its flags once (:mod:`drmlab.cli.train_request`): what to train into a TrainRequest,
where and how into a RunPlace, with --fast applied to the request and the namespace left as parsed."""

from dataclasses import fields

import pytest

from drmlab.cli import build_parser
from drmlab.cli.train_request import RunPlace, TrainRequest
from drmlab.training import fast


def parsed(*flags: str):
    args = build_parser().parse_args(["train", *flags])
    args.argv = ["train", *flags]
    return args


def test_every_train_flag_lands_in_the_request_or_the_place():
    args = parsed("--model", "GPT2", "--set", "lr=1e-3", "--threads", "1", "--out", "runs/x")
    request, place = TrainRequest.from_args(args), RunPlace.from_args(args)
    read = {f.name for f in fields(TrainRequest)} | {f.name for f in fields(RunPlace)}
    assert set(vars(args)) - {"verb", "func"} <= read
    assert (request.model, request.assignments, request.out) == ("GPT2", ("lr=1e-3",), "runs/x")
    assert (place.threads, place.argv) == (1, tuple(args.argv))


@pytest.mark.parametrize("rank, quiet", [("0", False), ("1", True)])
def test_only_process_0_reports(monkeypatch, rank, quiet):
    monkeypatch.setenv("RANK", rank)
    place = RunPlace.from_args(parsed())
    assert (place.main_process, place.quiet) == (not quiet, quiet)


def test_fast_is_carried_by_the_request(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("DRMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fast, "_cpu_flags", lambda: {"avx512_bf16"})
    args = parsed("--fast", "--device", "cpu")
    request = TrainRequest.from_args(args).with_fast("cpu")
    assert (request.bf16, request.bf16_memory_products, request.compile) == (True, True, True)
    assert (args.bf16, args.compile) == (None, None)  # the namespace stays as parsed
    resumed = TrainRequest.from_args(parsed("--fast", "--resume", "--out", "runs/x")).with_fast("cpu")
    assert (resumed.bf16, resumed.bf16_memory_products) == (True, None)  # a resume keeps the run's own
    plain = TrainRequest.from_args(parsed())
    assert plain.with_fast("cpu") is plain
