"""autotune.search.space: knob checks, suggestions through a duck-typed trial, fitting a space to a
device."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from autotune.search.devices import restrict_to_device, without_ddp
from autotune.search.knob import ddp_args
from autotune.search.space import KNOBS, Choices, Domain, Range, Space, complete, suggest


def make_space(**overrides: Domain) -> Space:
    """Every knob fixed to one value, except the overrides."""
    fixed: dict[str, Domain] = {
        "lr": Choices((0.01,)),
        "scheduler": Choices(("constant",)),
        "batch_size": Choices((32,)),
        "accumulation_steps": Choices((1,)),
        "data_on_device": Choices((False,)),
        "num_workers": Choices((0,)),
        "prefetch_factor": Choices((2,)),
        "pin_memory": Choices((False,)),
        "precision": Choices(("fp32",)),
        "schedule_epochs": Choices((4.0,)),
        "channels_last": Choices((False,)),
        "compile": Choices((False,)),
        "cudnn_benchmark": Choices((False,)),
        "tf32": Choices((False,)),
        "fused_optimizer": Choices((False,)),
        "checkpointing": Choices((False,)),
        "ddp_bucket_cap_mb": Choices((25,)),
        "ddp_gradient_as_bucket_view": Choices((False,)),
        "ddp_static_graph": Choices((False,)),
    }
    fixed.update(overrides)
    return Space(tuple((name, fixed[name]) for name in KNOBS))


class FakeTrial:
    """Records every suggestion asked of it; answers from `answers`, else the first choice or
    low."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        self.calls.append(("float", name, (low, high), {"log": log}))
        return self.answers.get(name, low)

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int:
        self.calls.append(("int", name, (low, high), {"log": log}))
        return self.answers.get(name, low)

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.calls.append(("categorical", name, tuple(choices), {}))
        return self.answers.get(name, choices[0])

    @property
    def names(self) -> list[str]:
        return [call[1] for call in self.calls]


# ---------------------------------------------------------------------------------------------
# suggest


def test_fully_fixed_space_asks_nothing() -> None:
    """Single-choice domains are never suggested; their value is used as is."""
    trial = FakeTrial()
    config = suggest(make_space(), trial)
    assert trial.calls == []
    assert config == {
        "lr": 0.01,
        "scheduler": "constant",
        "batch_size": 32,
        "accumulation_steps": 1,
        "data_on_device": False,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
        "precision": "fp32",
        "schedule_epochs": 4.0,
        "channels_last": False,
        "compile": False,
        "cudnn_benchmark": False,
        "tf32": False,
        "fused_optimizer": False,
        "checkpointing": False,
        "ddp_bucket_cap_mb": 25,
        "ddp_gradient_as_bucket_view": False,
        "ddp_static_graph": False,
    }


def test_prefetch_factor_not_suggested_without_workers() -> None:
    """num_workers 0: prefetch_factor does not exist, so it is None and never asked for."""
    trial = FakeTrial(num_workers=0)
    space = make_space(num_workers=Choices((0, 2)), prefetch_factor=Choices((2, 4, 8)))
    config = suggest(space, trial)
    assert config["num_workers"] == 0
    assert config["prefetch_factor"] is None
    assert "prefetch_factor" not in trial.names
    assert trial.calls == [("categorical", "num_workers", (0, 2), {})]


def test_prefetch_factor_suggested_with_workers() -> None:
    """num_workers > 0: prefetch_factor is sampled from its domain."""
    trial = FakeTrial(num_workers=2, prefetch_factor=4)
    config = suggest(
        make_space(num_workers=Choices((0, 2)), prefetch_factor=Choices((2, 4, 8))), trial
    )
    assert config["num_workers"] == 2 and config["prefetch_factor"] == 4
    assert ("categorical", "prefetch_factor", (2, 4, 8), {}) in trial.calls


def test_prefetch_factor_fixed_value_used_with_fixed_workers() -> None:
    """Workers fixed above 0 and prefetch_factor fixed: the fixed value, no suggestion."""
    trial = FakeTrial()
    config = suggest(make_space(num_workers=Choices((1,)), prefetch_factor=Choices((8,))), trial)
    assert config["prefetch_factor"] == 8 and trial.calls == []


def test_prefetch_factor_depends_on_a_ranged_num_workers() -> None:
    """The condition uses the sampled worker count, whichever way it was sampled."""
    space = make_space(num_workers=Range(0, 4), prefetch_factor=Range(2, 8))
    zero, two = FakeTrial(num_workers=0), FakeTrial(num_workers=2, prefetch_factor=3)
    assert suggest(space, zero)["prefetch_factor"] is None
    assert zero.names == ["num_workers"]
    assert suggest(space, two)["prefetch_factor"] == 3
    assert two.calls[-1] == ("int", "prefetch_factor", (2, 8), {"log": False})


def test_ranges_call_suggest_int_or_float_with_log_passed_through() -> None:
    """Int knobs use suggest_int, float knobs suggest_float, each with its log flag, in knob
    order."""
    space = make_space(
        lr=Range(1e-3, 0.5, log=True),
        batch_size=Range(16, 256, log=True),
        accumulation_steps=Range(1, 4),
        scheduler=Choices(("step", "cosine")),
    )
    trial = FakeTrial()
    config = suggest(space, trial)
    assert trial.calls == [
        ("float", "lr", (1e-3, 0.5), {"log": True}),
        ("categorical", "scheduler", ("step", "cosine"), {}),
        ("int", "batch_size", (16, 256), {"log": True}),
        ("int", "accumulation_steps", (1, 4), {"log": False}),
    ]
    assert (config["lr"], config["scheduler"], config["batch_size"]) == (1e-3, "step", 16)


def test_int_range_bounds_are_passed_as_ints() -> None:
    """suggest_int gets int bounds even if the range was stored with floats."""
    trial = FakeTrial()
    suggest(make_space(batch_size=Range(16.0, 64.0)), trial)
    ((_, _, (low, high), _),) = trial.calls
    assert (low, high) == (16, 64) and type(low) is int and type(high) is int


# ---------------------------------------------------------------------------------------------
# restrict_to_device


ALL_PRECISIONS = Choices(("fp32", "fp16", "bf16"))
BOTH_PIN = Choices((False, True))


def test_cpu_removes_fp16_and_fixes_pin_memory_with_notices() -> None:
    """Without CUDA: fp16 goes, pin_memory is fixed to false, one notice each."""
    space, notices, impossible = restrict_to_device(
        make_space(precision=ALL_PRECISIONS, pin_memory=BOTH_PIN), cuda=False, bf16=True
    )
    assert space["precision"] == Choices(("fp32", "bf16"))
    assert space["pin_memory"] == Choices((False,))
    assert impossible == {}
    assert len(notices) == 2
    assert any("fp16" in n and "CUDA" in n for n in notices)
    assert any("pin_memory" in n and "false" in n for n in notices)


def test_cpu_only_fp16_is_impossible() -> None:
    """A space whose only precision cannot run reports it instead of emptying the knob."""
    space, _, impossible = restrict_to_device(
        make_space(precision=Choices(("fp16",))), cuda=False, bf16=True
    )
    assert set(impossible) == {"precision"}
    assert space["precision"] == Choices(("fp16",))  # left for the caller to turn into an error


def test_cpu_pin_memory_fixed_true_is_impossible() -> None:
    """pin_memory: true alone cannot be honoured without CUDA."""
    _, notices, impossible = restrict_to_device(
        make_space(pin_memory=Choices((True,))), cuda=False, bf16=True
    )
    assert set(impossible) == {"pin_memory"}
    assert not any("pin_memory" in n for n in notices)


def test_cuda_without_bf16_removes_bf16() -> None:
    """On a GPU without bf16, bf16 goes with a notice; fp16 and pin_memory stay."""
    space, notices, impossible = restrict_to_device(
        make_space(precision=ALL_PRECISIONS, pin_memory=BOTH_PIN), cuda=True, bf16=False
    )
    assert space["precision"] == Choices(("fp32", "fp16"))
    assert space["pin_memory"] == BOTH_PIN
    assert impossible == {}
    assert len(notices) == 1 and "bf16" in notices[0]


def test_cuda_with_bf16_keeps_everything_silently() -> None:
    """A device that runs everything changes nothing and says nothing."""
    original = make_space(precision=ALL_PRECISIONS, pin_memory=BOTH_PIN)
    space, notices, impossible = restrict_to_device(original, cuda=True, bf16=True)
    assert (space, notices, impossible) == (original, [], {})


def test_cpu_with_only_runnable_choices_is_unchanged() -> None:
    """Nothing to remove on CPU: no notice."""
    original = make_space(precision=Choices(("fp32", "bf16")))
    assert restrict_to_device(original, cuda=False, bf16=True) == (original, [], {})


# ---------------------------------------------------------------------------------------------
# complete


def test_complete_fills_prefetch_none_without_workers() -> None:
    """Stored params lack prefetch_factor when num_workers was 0; complete puts None back."""
    stored = {
        "lr": 0.1,
        "scheduler": "cosine",
        "batch_size": 64,
        "accumulation_steps": 2,
        "num_workers": 0,
        "pin_memory": False,
        "precision": "fp32",
    }
    full = complete(stored)
    assert list(full) == list(KNOBS)
    assert full["prefetch_factor"] is None
    assert full["schedule_epochs"] is None  # stored before it was a knob: the study's max_epochs
    # stored before they were knobs: the trial ran without them
    new = (
        "data_on_device",
        "channels_last",
        "compile",
        "cudnn_benchmark",
        "tf32",
        "fused_optimizer",
        "checkpointing",
    )
    assert [full[k] for k in new] == [False] * len(new)
    # DistributedDataParallel's own defaults, as every trial on several devices ran before
    ddp = {"ddp_bucket_cap_mb": 25, "ddp_gradient_as_bucket_view": False, "ddp_static_graph": False}
    assert {k: full[k] for k in ddp} == ddp
    new = ("prefetch_factor", "schedule_epochs", *new, *ddp)
    assert {k: v for k, v in full.items() if k not in new} == stored


def test_complete_drops_a_stale_prefetch_without_workers_and_keeps_it_with_workers() -> None:
    """prefetch_factor is meaningless without workers, kept as given with them."""
    assert complete({"num_workers": 0, "prefetch_factor": 4})["prefetch_factor"] is None
    assert complete({"num_workers": 2, "prefetch_factor": 4})["prefetch_factor"] == 4


# ---------------------------------------------------------------------------------------------
# Knob.check: (knob, value, accepted?)


CHECKS: list[tuple[str, Any, bool]] = [
    ("lr", 0.001, True),
    ("lr", 1, True),  # an int is a number
    ("lr", 0.0, False),
    ("lr", -0.1, False),
    ("lr", True, False),  # bool is not a number
    ("lr", math.inf, False),
    ("lr", math.nan, False),
    ("lr", "0.1", False),  # text is converted by spec, not accepted by the knob
    ("batch_size", 1, True),
    ("batch_size", 0, False),
    ("batch_size", True, False),  # bool is not an int
    ("batch_size", 32.0, False),
    ("accumulation_steps", 4, True),
    ("accumulation_steps", 0, False),
    ("num_workers", 0, True),
    ("num_workers", -1, False),
    ("num_workers", False, False),
    ("prefetch_factor", 1, True),
    ("prefetch_factor", 0, False),
    ("prefetch_factor", None, False),
    ("pin_memory", True, True),
    ("pin_memory", False, True),
    ("pin_memory", 1, False),
    ("pin_memory", "true", False),
    ("scheduler", "onecycle", True),
    ("scheduler", "linear", False),
    ("scheduler", "Cosine", False),
    ("precision", "bf16", True),
    ("precision", "fp8", False),
    ("precision", None, False),
    ("checkpointing", True, True),
    ("checkpointing", False, True),
    ("checkpointing", 0.5, True),
    ("checkpointing", 0, True),  # read as false
    ("checkpointing", 1, True),  # read as true
    ("checkpointing", 1.5, False),
    ("checkpointing", -0.25, False),
    ("checkpointing", math.nan, False),
    ("checkpointing", "half", False),
]


@pytest.mark.parametrize(
    ("knob", "value", "accepted"), CHECKS, ids=[f"{k}={v!r}" for k, v, _ in CHECKS]
)
def test_knob_check(knob: str, value: Any, accepted: bool) -> None:
    """None for an acceptable value; otherwise a phrase naming the knob and what it takes."""
    problem = KNOBS[knob].check(value)
    if accepted:
        assert problem is None
    else:
        assert isinstance(problem, str) and problem.startswith(f"{knob} takes ")


def test_checkpointing_values_have_one_spelling() -> None:
    """0 and 1 are false and true (so [false, 0] repeats a choice); a share in between a float."""
    knob = KNOBS["checkpointing"]
    assert [knob.normal(v) for v in (0, 0.0, 1, 1.0, 0.5, True, False)] == [
        False,
        False,
        True,
        True,
        0.5,
        True,
        False,
    ]
    assert all(type(knob.normal(v)) is bool for v in (0, 1.0))
    assert knob.normal(1) is True and knob.normal(0.0) is False


def test_categorical_check_lists_the_accepted_names() -> None:
    """The rejection of a name says which names exist."""
    assert (
        KNOBS["scheduler"].check("linear")
        == "scheduler takes one of constant, step, cosine, onecycle"
    )
    assert KNOBS["precision"].check("fp8") == "precision takes one of fp32, fp16, bf16"


def test_params_are_suggested_after_the_knobs_each_by_its_kind() -> None:
    """Integer ranges go to suggest_int, real ones to suggest_float (log kept), lists to
    suggest_categorical; a fixed value is not sampled at all."""
    space = dataclasses.replace(
        make_space(),
        params=(
            ("width", Range(16, 64)),
            ("dropout", Range(0.0, 0.5)),
            ("wd", Range(1e-5, 1e-3, log=True)),
            ("act", Choices(("relu", "gelu"))),
            ("depth", Choices((3,))),
        ),
    )
    calls = []

    class Recorder:
        def suggest_int(self, name, low, high, *, log=False):
            calls.append(("int", name, low, high, log))
            return low

        def suggest_float(self, name, low, high, *, log=False):
            calls.append(("float", name, low, high, log))
            return high

        def suggest_categorical(self, name, choices):
            calls.append(("categorical", name, tuple(choices)))
            return choices[-1]

    config = suggest(space, Recorder())
    assert calls == [
        ("int", "width", 16, 64, False),
        ("float", "dropout", 0.0, 0.5, False),
        ("float", "wd", 1e-5, 1e-3, True),
        ("categorical", "act", ("relu", "gelu")),
    ]
    assert list(config)[len(KNOBS) :] == ["width", "dropout", "wd", "act", "depth"]
    assert (config["width"], config["dropout"], config["act"], config["depth"]) == (
        16,
        0.5,
        "gelu",
        3,
    )
    assert complete(config) == config  # stored and completed, the parameters survive


def test_restricting_to_the_device_keeps_the_params() -> None:
    space = dataclasses.replace(make_space(), params=(("width", Range(8, 32)),))
    restricted, _, _ = restrict_to_device(
        space.replace("precision", Choices(("fp32", "fp16"))), cuda=False, bf16=True
    )
    assert restricted.params == space.params and restricted["precision"] == Choices(("fp32",))


BOTH = Choices((False, True))


def test_cpu_fixes_cudnn_benchmark_tf32_compile_keeps_channels_last_and_the_fused_step() -> None:
    """Without CUDA: cuDNN's search and TF32 are fixed off, and compile (a choice) too, each with a
    notice saying why; channels-last and the fused optimizer step run on CPU and stay choices."""
    space, notices, impossible = restrict_to_device(
        make_space(
            channels_last=BOTH, compile=BOTH, cudnn_benchmark=BOTH, tf32=BOTH, fused_optimizer=BOTH
        ),
        cuda=False,
        bf16=True,
    )
    assert (space["cudnn_benchmark"], space["compile"], space["tf32"]) == (Choices((False,)),) * 3
    assert space["channels_last"] == space["fused_optimizer"] == BOTH
    assert impossible == {}
    assert sorted(n.split(" fixed")[0] for n in notices) == ["compile", "cudnn_benchmark", "tf32"]
    assert any("cuDNN runs only on CUDA" in n for n in notices)
    assert any("TF32 tensor cores are on NVIDIA GPUs only" in n for n in notices)


@pytest.mark.parametrize("cuda", [False, True])
def test_checkpointing_is_a_choice_on_cuda_and_fixed_off_on_cpu_unless_the_file_fixes_it(
    cuda: bool,
) -> None:
    """On CPU memory rarely bounds the batch: a choice is fixed off with a notice; a share the
    study file fixes stays, as does every choice on CUDA."""
    choice = Choices((False, 0.5, True))
    space, notices, _ = restrict_to_device(make_space(checkpointing=choice), cuda=cuda, bf16=True)
    if cuda:
        assert space["checkpointing"] == choice and notices == []
    else:
        assert space["checkpointing"] == Choices((False,))
        assert [n for n in notices if "recomputing activations only costs time" in n]
    fixed, notices, _ = restrict_to_device(
        make_space(checkpointing=Choices((0.5,))), cuda=False, bf16=True
    )
    assert fixed["checkpointing"] == Choices((0.5,)) and notices == []


def test_cpu_keeps_compile_fixed_on_where_a_compiler_works() -> None:
    """compile: true alone is the user's choice: kept on CPU when torch.compile can run there."""
    space, notices, impossible = restrict_to_device(
        make_space(compile=Choices((True,))), cuda=False, bf16=True
    )
    assert space["compile"] == Choices((True,)) and notices == [] and impossible == {}


@pytest.mark.parametrize(
    "knob, problem",
    [
        ("compile", "compile_problem"),
        ("channels_last", "channels_last_problem"),
        ("tf32", "tf32_problem"),
        ("fused_optimizer", "fused_optimizer_problem"),
        ("checkpointing", "checkpointing_problem"),
        ("data_on_device", "data_on_device_problem"),
    ],
)
def test_a_switch_that_cannot_run_is_fixed_off_or_impossible(knob: str, problem: str) -> None:
    """On CUDA too: a choice is fixed to false naming the reason; true alone is impossible."""
    space, notices, impossible = restrict_to_device(
        make_space(**{knob: BOTH}), cuda=True, bf16=True, **{problem: "the reason"}
    )
    assert (
        space[knob] == Choices((False,))
        and notices == [f"{knob} fixed to false: the reason"]
        and impossible == {}
    )
    _, _, impossible = restrict_to_device(
        make_space(**{knob: Choices((True,))}), cuda=True, bf16=True, **{problem: "the reason"}
    )
    assert list(impossible) == [knob] and "the reason" in impossible[knob]


def test_cuda_keeps_every_switch() -> None:
    original = make_space(
        channels_last=BOTH,
        compile=BOTH,
        cudnn_benchmark=BOTH,
        pin_memory=BOTH,
        tf32=BOTH,
        fused_optimizer=BOTH,
        checkpointing=BOTH,
    )
    assert restrict_to_device(original, cuda=True, bf16=True) == (original, [], {})


def test_checkpointing_shares_are_fixed_off_with_on_for_a_model_without_the_hook() -> None:
    """A share of the blocks is on: a model without checkpoint_blocks() cannot run it."""
    space, notices, impossible = restrict_to_device(
        make_space(checkpointing=Choices((False, 0.5, True))),
        cuda=False,
        bf16=True,
        checkpointing_problem="no hook",
    )
    assert space["checkpointing"] == Choices((False,)) and notices == [
        "checkpointing fixed to false: no hook"
    ]
    _, _, impossible = restrict_to_device(
        make_space(checkpointing=Choices((0.5, True))),
        cuda=False,
        bf16=True,
        checkpointing_problem="no hook",
    )
    assert impossible == {
        "checkpointing": "checkpointing: 0.5 or true is not possible here: no hook"
    }


# ---------------------------------------------------------------------------------------------
# DistributedDataParallel's knobs on one device

DDP_DEFAULTS = {"ddp_bucket_cap_mb": 25, "ddp_gradient_as_bucket_view": False}
BASELINE = {**DDP_DEFAULTS, "ddp_static_graph": False}


def test_ddp_knobs_left_out_are_ddp_defaults_and_change_nothing_on_one_device() -> None:
    space = make_space()
    assert without_ddp(space, BASELINE) == (space, BASELINE, [], {})
    assert ddp_args(complete({})) == {
        "bucket_cap_mb": 25,
        "gradient_as_bucket_view": False,
        "static_graph": False,
    }


def test_ddp_choices_on_one_device_are_fixed_to_the_defaults_with_one_notice() -> None:
    space = make_space(
        ddp_bucket_cap_mb=Range(10, 100),
        ddp_gradient_as_bucket_view=Choices((False, True)),
        ddp_static_graph=Choices((True, False)),
    )
    baseline = {**BASELINE, "ddp_static_graph": True}
    fixed, fitted, notices, impossible = without_ddp(space, baseline)
    assert fixed == make_space() and impossible == {}
    assert fitted == BASELINE
    assert notices == [
        "ddp_bucket_cap_mb to 25, ddp_gradient_as_bucket_view to false, ddp_static_graph to "
        "false fixed: DistributedDataParallel's settings apply only with devices_per_trial > 1",
        "baseline ddp_static_graph to false set: DistributedDataParallel's settings apply only "
        "with devices_per_trial > 1",
    ]


def test_a_ddp_value_without_the_default_is_refused_on_one_device() -> None:
    space = make_space(ddp_bucket_cap_mb=Range(50, 100), ddp_static_graph=Choices((True,)))
    _, _, notices, impossible = without_ddp(space, BASELINE)
    assert notices == []
    assert impossible == {
        "ddp_bucket_cap_mb": (
            {"low": 50, "high": 100, "log": False},
            "DistributedDataParallel's settings apply only with devices_per_trial > 1: give "
            "that, or leave ddp_bucket_cap_mb out",
        ),
        "ddp_static_graph": (
            [True],
            "DistributedDataParallel's settings apply only with devices_per_trial > 1: give "
            "that, or leave ddp_static_graph out",
        ),
    }
