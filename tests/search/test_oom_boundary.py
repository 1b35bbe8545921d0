"""The out-of-memory boundary: which configurations are known to run out before they run."""

from __future__ import annotations

from autotune.search.oom_boundary import bound_by, contradicted, needs_at_least, not_run_reason

BASE = {
    "lr": 0.1,
    "scheduler": "cosine",
    "batch_size": 128,
    "accumulation_steps": 1,
    "num_workers": 0,
    "prefetch_factor": None,
    "pin_memory": False,
    "precision": "bf16",
}


def test_a_larger_or_equal_micro_batch_in_a_precision_as_wide_needs_at_least_as_much() -> None:
    assert needs_at_least({**BASE, "batch_size": 256}, BASE)
    assert needs_at_least(BASE, BASE)
    assert needs_at_least({**BASE, "precision": "fp32"}, BASE)  # 4 bytes per activation, not 2
    assert needs_at_least({**BASE, "precision": "fp16"}, BASE)  # as wide as bf16


def test_a_smaller_micro_batch_or_a_narrower_precision_may_fit() -> None:
    assert not needs_at_least({**BASE, "batch_size": 64}, BASE)
    assert not needs_at_least({**BASE, "precision": "bf16"}, {**BASE, "precision": "fp32"})


def test_knobs_that_do_not_change_memory_are_ignored_and_parameters_must_match() -> None:
    other = {
        **BASE,
        "lr": 0.01,
        "scheduler": "constant",
        "accumulation_steps": 4,
        "num_workers": 2,
        "prefetch_factor": 4,
        "pin_memory": True,
    }
    assert needs_at_least(other, BASE)
    # a narrower model may fit
    assert not needs_at_least({**BASE, "width": 16}, {**BASE, "width": 64})
    assert needs_at_least({**BASE, "width": 64}, {**BASE, "width": 64})


def test_a_bound_holds_only_between_equal_ddp_settings() -> None:
    """DDP's buckets hold a copy of the gradients, or their storage with gradient_as_bucket_view;
    a study begun before the knobs ran DDP's defaults."""
    for knob, value in (
        ("ddp_bucket_cap_mb", 100),
        ("ddp_gradient_as_bucket_view", True),
        ("ddp_static_graph", True),
    ):
        assert not needs_at_least({**BASE, "batch_size": 256, knob: value}, BASE)
        assert needs_at_least({**BASE, "batch_size": 256, knob: value}, {**BASE, knob: value})
    assert needs_at_least({**BASE, "ddp_bucket_cap_mb": 25}, BASE)


def test_a_bound_holds_only_between_equal_memory_formats_compilation_and_cudnn_search() -> None:
    """Compiled kernels, channels-last layouts and cuDNN's algorithms change memory either way."""
    for knob in ("channels_last", "compile", "cudnn_benchmark"):
        assert not needs_at_least({**BASE, "batch_size": 256, knob: True}, {**BASE, knob: False})
        assert not needs_at_least({**BASE, "batch_size": 256, knob: False}, {**BASE, knob: True})
        assert needs_at_least({**BASE, "batch_size": 256, knob: True}, {**BASE, knob: True})
        # A configuration stored before the knob existed ran without it.
        assert needs_at_least({**BASE, "batch_size": 256, knob: False}, BASE)


def test_a_bound_holds_across_tf32_and_the_fused_step_which_change_no_tensor() -> None:
    for knob in ("tf32", "fused_optimizer"):
        assert needs_at_least({**BASE, "batch_size": 256, knob: True}, {**BASE, knob: False})
        assert needs_at_least({**BASE, "batch_size": 256, knob: False}, {**BASE, knob: True})


def test_bound_by_names_the_trial_that_ran_out_and_the_reason_says_why() -> None:
    ran_out = [(3, {**BASE, "batch_size": 256}), (5, BASE)]
    assert bound_by({**BASE, "batch_size": 512, "precision": "fp32"}, ran_out) == 3
    assert bound_by({**BASE, "batch_size": 128}, ran_out) == 5
    assert bound_by({**BASE, "batch_size": 64}, ran_out) is None
    assert bound_by(BASE, []) is None
    text = not_run_reason({**BASE, "batch_size": 512}, 5, BASE)
    assert "batch_size 512 in bf16" in text and "trial 5 (batch_size 128 in bf16)" in text


def test_a_run_out_of_memory_that_a_later_larger_configuration_trained_through_bounds_nothing() -> (
    None
):
    """Another process's memory for a while, or an error misread: what trained since says so."""
    ran_out = {3: {**BASE, "batch_size": 256}, 5: BASE}
    assert contradicted(ran_out, {6: {**BASE, "batch_size": 256, "lr": 0.3}}) == {3, 5}
    assert contradicted(ran_out, {6: {**BASE, "batch_size": 128, "precision": "fp32"}}) == {5}
    assert contradicted(ran_out, {4: {**BASE, "batch_size": 256}}) == {3}  # after 3, before 5
    # smaller, or narrower, or before it: no word on it
    assert contradicted(ran_out, {6: {**BASE, "batch_size": 64}}) == set()
    assert contradicted(ran_out, {1: {**BASE, "batch_size": 512}}) == set()
    assert contradicted(ran_out, {}) == set()


def test_running_out_with_checkpointing_bounds_no_more_of_it_on_the_same_or_a_larger_batch() -> (
    None
):
    """Out of memory with a share f of the blocks checkpointed: a micro-batch as large, a precision
    as wide and a share of at most f (none included) needs at least as much, and runs out too."""
    half = {**BASE, "checkpointing": 0.5}
    assert needs_at_least({**BASE, "checkpointing": 0.25}, half)
    assert needs_at_least({**BASE, "batch_size": 256, "checkpointing": False}, half)
    assert needs_at_least({**BASE, "batch_size": 256, "precision": "fp32"}, half)  # left out: off
    assert needs_at_least(half, half)
    assert needs_at_least({**BASE, "checkpointing": 0.5}, {**BASE, "checkpointing": True})
    assert needs_at_least({**BASE, "checkpointing": True}, {**BASE, "checkpointing": True})
    # More of the model checkpointed keeps fewer activations: it may fit.
    assert not needs_at_least({**BASE, "checkpointing": True}, half)
    assert not needs_at_least({**BASE, "checkpointing": 0.75}, half)
    # A smaller batch or a narrower precision may fit, as without checkpointing.
    assert not needs_at_least({**BASE, "batch_size": 64, "checkpointing": 0.25}, half)


def test_running_out_without_checkpointing_says_nothing_about_a_run_with_it() -> None:
    for other in (BASE, {**BASE, "checkpointing": False}):
        for share in (0.25, 0.5, True):
            assert not needs_at_least({**BASE, "batch_size": 256, "checkpointing": share}, other)
        assert needs_at_least({**BASE, "batch_size": 256, "checkpointing": False}, other)
    ran_out = [(2, BASE), (4, {**BASE, "batch_size": 256, "checkpointing": True})]
    assert bound_by({**BASE, "checkpointing": True}, ran_out) is None
    assert bound_by({**BASE, "batch_size": 512, "checkpointing": True}, ran_out) == 4
    text = not_run_reason({**BASE, "batch_size": 512, "checkpointing": 0.5}, 4, ran_out[1][1])
    assert "batch_size 512 in bf16 checkpointing 0.5 of blocks" in text
    assert "trial 4 (batch_size 256 in bf16 checkpointing all blocks)" in text


def test_running_out_with_the_training_set_on_the_device_says_nothing_about_a_run_without_it() -> (
    None
):
    """The set on the device may alone be what did not fit: a DataLoader's run at the same batch
    may fit. Without it, a run with it needs at least as much."""
    on = {**BASE, "data_on_device": True}
    assert not needs_at_least(BASE, on)
    assert not needs_at_least({**BASE, "batch_size": 256, "data_on_device": False}, on)
    assert needs_at_least({**on, "batch_size": 256}, on)
    assert needs_at_least(on, BASE)  # stored before the knob: a DataLoader's
    ran_out = [(7, on)]
    assert bound_by({**BASE, "batch_size": 512, "precision": "fp32"}, ran_out) is None
    assert bound_by({**on, "batch_size": 512}, ran_out) == 7
    text = not_run_reason({**on, "batch_size": 512}, 7, on)
    assert "batch_size 512 in bf16 with the training set on the device" in text
    assert "trial 7 (batch_size 128 in bf16 with the training set on the device)" in text
