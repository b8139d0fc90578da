"""The batch checks of flops_per_batch: a batch the model cannot run is refused with an
InputError naming the argument, on every path into the count (tensors, a padding mask, packed
documents, seqlens=)."""

from __future__ import annotations

import functools

import pytest
import torch

import exportflops
from exportflops.errors import InputError

transformers = pytest.importorskip("transformers")

POSITIONS = 32  # GPT-2's n_positions: its learned position table wpe holds 32 rows


@functools.lru_cache(maxsize=None)
def _gpt2_fpb():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_positions=POSITIONS, vocab_size=64, n_layer=1, n_head=2, n_embd=16, use_cache=False,
        bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 64, (2, 16))
    return exportflops.flops_per_batch(model, (), {
        "input_ids": ids, "attention_mask": torch.ones(2, 16, dtype=torch.long)})


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long)


def _mask(batch: int, seq: int) -> torch.Tensor:
    return torch.ones(batch, seq, dtype=torch.long)


def test_float_input_ids_are_refused_as_the_model_refuses_them():
    with pytest.raises(InputError, match="input_ids of the batch is float32, a floating dtype, "
                                         "where the example's was integer"):
        _gpt2_fpb()(input_ids=_ids(2, 16).float(), attention_mask=_mask(2, 16))


def test_int32_ids_and_a_bool_mask_count_as_the_examples_dtypes_do():
    fpb = _gpt2_fpb()
    assert fpb(input_ids=_ids(2, 16).int(), attention_mask=_mask(2, 16).bool()) == fpb(
        input_ids=_ids(2, 16), attention_mask=_mask(2, 16))


def test_a_row_longer_than_the_position_table_is_refused_naming_its_rows():
    fpb = _gpt2_fpb()
    fpb(input_ids=_ids(2, POSITIONS), attention_mask=_mask(2, POSITIONS))  # the last row fits
    with pytest.raises(InputError, match=r"rows of 64 positions \(padding included\).*"
                                         r"transformer\.wpe .*holds positions 0 \.\. 31"):
        fpb(input_ids=_ids(2, 64), attention_mask=_mask(2, 64))


def test_nanogpts_position_table_bounds_its_batches():
    """nanoGPT's GPTConfig is no transformers config: its wpe holds block_size = 1024 rows
    (model.py asserts t <= block_size)."""
    from exportflops.examples.gpt2 import gpt2

    model, (ids,) = gpt2(device="meta", seq_len=16, batch=2)
    fpb = exportflops.flops_per_batch(model, (ids,))
    fpb(torch.zeros(2, 1024, dtype=torch.long, device="meta"))  # the last row fits
    with pytest.raises(InputError, match=r"transformer\.wpe .*holds positions 0 \.\. 1023"):
        fpb(torch.zeros(2, 1025, dtype=torch.long, device="meta"))


def test_padding_does_not_make_a_row_fit_the_position_table():
    """GPT-2 looks up every position, padding's too: 64 positions fail with 20 tokens."""
    mask = _mask(2, 64)
    mask[:, 20:] = 0
    with pytest.raises(InputError, match="rows of 64 positions"):
        _gpt2_fpb()(input_ids=_ids(2, 64), attention_mask=mask)


def test_seqlens_is_held_against_the_position_table_per_document():
    fpb = _gpt2_fpb()
    fpb(seqlens=[POSITIONS, POSITIONS])  # packed documents restart their positions
    with pytest.raises(InputError, match="a packed document of 40 tokens"):
        fpb(seqlens=[40, 8])


@pytest.mark.parametrize("batch,seq,empty", [(2, 0, "seq"), (0, 16, "batch")],
                         ids=["no-positions", "no-rows"])
def test_a_batch_of_no_tokens_is_refused_as_seqlens_zero_is(batch, seq, empty):
    with pytest.raises(InputError, match=f"the batch's {empty} is 0"):
        _gpt2_fpb()(input_ids=_ids(batch, seq), attention_mask=_mask(batch, seq))


def test_a_mask_row_of_no_tokens_is_refused_naming_the_row():
    mask = _mask(2, 16)
    mask[1] = 0
    with pytest.raises(InputError, match=r"marks no token in row\(s\) \[1\].*seqlens=\[0"):
        _gpt2_fpb()(input_ids=_ids(2, 16), attention_mask=mask)


@pytest.mark.parametrize("value,words", [(2, "from 1 to 2"), (-1, "from -1 to 1")],
                         ids=["two", "minus-one"])
def test_mask_values_other_than_zero_and_one_are_refused(value, words):
    mask = _mask(2, 16)
    mask[0, 3] = value
    with pytest.raises(InputError, match=f"attention_mask holds values {words}"):
        _gpt2_fpb()(input_ids=_ids(2, 16), attention_mask=mask)


def test_a_float_mask_is_refused_with_the_cast_to_make():
    with pytest.raises(InputError, match=r"attention_mask of the batch is float32.*\.long\(\)"):
        _gpt2_fpb()(input_ids=_ids(2, 16), attention_mask=_mask(2, 16).float())


def test_a_mask_on_meta_is_refused_saying_its_values_are_needed():
    with pytest.raises(InputError, match="reads attention_mask's values .* meta device has none"):
        _gpt2_fpb()(input_ids=_ids(2, 16), attention_mask=_mask(2, 16).to("meta"))


def test_a_padded_rows_tokens_come_from_its_mask():
    """3 + 16 tokens: the step's tokens and padding as the mask marks them."""
    mask = _mask(2, 16)
    mask[0, 3:] = 0
    step = _gpt2_fpb().step(input_ids=_ids(2, 16), attention_mask=mask)
    assert (step.tokens, step.padded_tokens) == (3 + 16, 13)
