"""The transformer a budget is derived for: sizes as plain numbers, or read from a config object
or dict by its field names: Hugging Face's (GPT-2, Llama, Mistral, Qwen2), nanoGPT's ``GPTConfig``
or Meta's Llama ``params.json``. ``transformers`` is never imported.

Symbols used in the budgets' formulas: L layers, d width, H query heads, KV key/value heads,
hd head dim, f FFN width, V vocabulary, T sequence length, B batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import model_validator

from ..records import Record

HeadPositions = Literal["all", "last"]
AttentionPairs = Literal["square", "causal"]


class TransformerConfig(Record):
    """A decoder-only transformer and the call it is budgeted for (``batch`` x ``seq_len``)."""

    layers: int
    """Transformer blocks, L."""
    width: int
    """Model width d (d_model, n_embd, hidden_size)."""
    heads: int
    """Query heads, H."""
    kv_heads: int
    """Key/value heads, KV: ``heads`` for multi-head attention, fewer for grouped-query (GQA),
    1 for multi-query. Defaults to ``heads``."""
    head_dim: int
    """Size of one head, hd (query, key and value alike). Defaults to ``width // heads``."""
    ffn_width: int
    """Hidden width f of the feed-forward block (4d in GPT-2; ``intermediate_size`` in Llama)."""
    gated_ffn: bool = False
    """A gated FFN (SwiGLU, GeGLU): gate and up projections d -> f, then down f -> d; three
    weight matrices instead of two."""
    vocab: int
    """Vocabulary V: rows of the token embedding and outputs of the LM head."""
    seq_len: int
    """Tokens per sequence in the budgeted call, T."""
    batch: int = 1
    """Sequences in the budgeted call, B."""
    tied_embeddings: bool = False
    """The LM head multiplies by the token embedding's table (GPT-2, PaLM): its weight is
    counted once, as a matmul weight."""
    head_positions: HeadPositions = "all"
    """Positions the LM head runs on: ``all`` T (training, and the sources' formulas) or
    ``last`` (generation: nanoGPT at inference computes the logits of the last position only)."""
    qkv_bias: bool = False
    """Query, key and value projections have biases (GPT-2, Qwen2)."""
    out_bias: bool = False
    """The attention output projection has a bias (GPT-2)."""
    mlp_bias: bool = False
    """The FFN projections have biases (GPT-2)."""
    norm_bias: bool = False
    """Norms have a bias as well as a weight (GPT-2's LayerNorm); RMSNorm and bias-free
    LayerNorm have a weight only. Two norms per block and a final norm."""
    learned_positions: int = 0
    """Rows of a learned absolute position table (GPT-2: ``n_positions``); 0 for rotary or
    relative positions, which have no table."""
    attention_pairs: AttentionPairs = "square"
    """(query, key) pairs the attention matmuls are budgeted over: ``square``, all T x T of them
    (nanoGPT, PaLM, torchtitan, and exportflops' SDPA count), or ``causal``, the T(T+1)/2 a causal
    mask keeps (Megatron-LM, MaxText, flash-attention's benchmarks)."""
    name: str = ""
    """A label for tables, e.g. ``GPT-2 124M``."""

    @model_validator(mode="before")
    @classmethod
    def _default_heads(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        heads, width = data.get("heads"), data.get("width")
        if data.get("kv_heads") is None:
            data["kv_heads"] = heads
        if data.get("head_dim") is None and isinstance(heads, int) and isinstance(width, int):
            if width % heads:
                raise ValueError(f"width {width} is not a multiple of heads {heads}: "
                                 f"pass head_dim explicitly")
            data["head_dim"] = width // heads
        return data

    @model_validator(mode="after")
    def _check(self) -> TransformerConfig:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads}): each key/value head serves a whole group")
        return self

    # Derived sizes, named as the budgets' formulas name them.

    @property
    def q_width(self) -> int:
        """H * hd: width of the queries (d_attn in Kaplan, key_size x heads in Chinchilla)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """KV * hd: width of the keys, and of the values."""
        return self.kv_heads * self.head_dim

    @property
    def tokens(self) -> int:
        """B * T."""
        return self.batch * self.seq_len

    def pairs_per_layer(self, convention: AttentionPairs | None = None) -> int:
        """(query, key) pairs of one layer, every head, the batch: B H T T for ``square``,
        B H T(T+1)/2 for ``causal`` (a top-left mask keeps key j <= query i). ``convention``
        defaults to `attention_pairs`."""
        per_head = (self.seq_len * self.seq_len
                    if (convention or self.attention_pairs) == "square"
                    else self.seq_len * (self.seq_len + 1) // 2)
        return self.batch * self.heads * per_head

    @property
    def head_rows(self) -> int:
        """Rows the LM head multiplies: B * T, or B with ``head_positions="last"``."""
        return self.tokens if self.head_positions == "all" else self.batch

    def params(self) -> ParamCounts:
        """Parameters by group, derived from the sizes (a tied table counted once)."""
        d, f, layers = self.width, self.ffn_width, self.layers
        attention = (d * (self.q_width + 2 * self.kv_width)  # query, key, value weights
                     + self.q_width * d  # output projection
                     + (self.q_width + 2 * self.kv_width if self.qkv_bias else 0)
                     + (d if self.out_bias else 0))
        projections = 3 if self.gated_ffn else 2
        ffn = (projections * d * f
               + ((projections - 1) * f + d if self.mlp_bias else 0))  # up (and gate), down
        norm = d * (2 if self.norm_bias else 1)
        token = self.vocab * d
        return ParamCounts(
            token_embedding=token,
            position_embedding=self.learned_positions * d,
            attention=layers * attention,
            ffn=layers * ffn,
            norms=(2 * layers + 1) * norm,
            head=0 if self.tied_embeddings else token,
            matmul_weights=layers * (d * (self.q_width + 2 * self.kv_width) + self.q_width * d
                                     + projections * d * f) + token,
            tied_embeddings=self.tied_embeddings,
        )

    # Constructors from Hugging Face configs.

    @classmethod
    def from_hf(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                head_positions: HeadPositions = "all") -> TransformerConfig:
        """From a Hugging Face config object or dict: GPT-2, Llama, Mistral or Qwen2.

        The family is read from ``model_type`` when present, else from the field names.
        ``seq_len`` defaults to the config's context length.
        """
        model_type = _field(config, "model_type", None)
        if model_type == "gpt2" or (model_type is None and _has(config, "n_embd")):
            return cls.from_gpt2(config, seq_len=seq_len, batch=batch,
                                 head_positions=head_positions)
        if model_type == "qwen2":
            return cls.from_qwen2(config, seq_len=seq_len, batch=batch,
                                  head_positions=head_positions)
        if model_type in ("llama", "mistral") or (model_type is None
                                                  and _has(config, "intermediate_size")):
            return cls.from_llama(config, seq_len=seq_len, batch=batch,
                                  head_positions=head_positions)
        raise ValueError(f"cannot tell the family of this config (model_type={model_type!r}): "
                         f"call TransformerConfig.from_gpt2, from_llama, from_mistral or "
                         f"from_qwen2, or build TransformerConfig(...) from plain numbers")

    @classmethod
    def from_gpt2(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                  head_positions: HeadPositions = "all") -> TransformerConfig:
        """From a Hugging Face ``GPT2Config`` (or dict): biases everywhere, LayerNorm with bias, a
        learned position table of ``n_positions`` rows, head tied unless ``tie_word_embeddings``
        is false. ``seq_len`` defaults to ``n_positions``."""
        width = _field(config, "n_embd")
        return cls._gpt2_layout(
            config, width=width, ffn_width=_field(config, "n_inner", None) or 4 * width,
            positions=_field(config, "n_positions"), bias=True,
            tied=bool(_field(config, "tie_word_embeddings", True)), seq_len=seq_len, batch=batch,
            head_positions=head_positions)

    @classmethod
    def from_nanogpt(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                     head_positions: HeadPositions = "all") -> TransformerConfig:
        """From nanoGPT's ``GPTConfig`` (model.py; also `exportflops.examples.gpt2.GPTConfig`):
        GPT-2's layout with a position table of ``block_size`` rows, head tied, biases and
        LayerNorm biases where ``bias`` says. nanoGPT's forward without targets runs the head on
        the last position only: pass ``head_positions="last"`` to budget that call."""
        width = _field(config, "n_embd")
        return cls._gpt2_layout(
            config, width=width, ffn_width=4 * width, positions=_field(config, "block_size"),
            bias=bool(_field(config, "bias", True)), tied=True, seq_len=seq_len, batch=batch,
            head_positions=head_positions)

    @classmethod
    def _gpt2_layout(cls, config: Any, *, width: int, ffn_width: int, positions: int, bias: bool,
                     tied: bool, seq_len: int | None, batch: int,
                     head_positions: HeadPositions) -> TransformerConfig:
        """GPT-2: multi-head attention, GELU FFN, learned positions; HF and nanoGPT name the
        layer and head counts alike (``n_layer``, ``n_head``, ``vocab_size``)."""
        return cls(
            layers=_field(config, "n_layer"), width=width, heads=_field(config, "n_head"),
            ffn_width=ffn_width, gated_ffn=False, vocab=_field(config, "vocab_size"),
            seq_len=positions if seq_len is None else seq_len, batch=batch,
            tied_embeddings=tied, head_positions=head_positions, qkv_bias=bias, out_bias=bias,
            mlp_bias=bias, norm_bias=bias, learned_positions=positions, name=_name(config),
        )

    @classmethod
    def from_llama(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                   head_positions: HeadPositions = "all", qkv_bias: bool | None = None
                   ) -> TransformerConfig:
        """From a ``LlamaConfig`` or ``MistralConfig`` (or dict): SwiGLU FFN, RMSNorm, rotary
        positions; biases only where ``attention_bias`` / ``mlp_bias`` say so.

        A sliding window (Mistral) is not modeled: the budgets, like the exported graph of a
        masked SDPA call, count attention over the whole T x T square.
        """
        attention_bias = bool(_field(config, "attention_bias", False))
        heads = _field(config, "num_attention_heads")
        return cls(
            layers=_field(config, "num_hidden_layers"), width=_field(config, "hidden_size"),
            heads=heads, kv_heads=_field(config, "num_key_value_heads", None) or heads,
            head_dim=_field(config, "head_dim", None),
            ffn_width=_field(config, "intermediate_size"), gated_ffn=True,
            vocab=_field(config, "vocab_size"),
            seq_len=_field(config, "max_position_embeddings") if seq_len is None else seq_len,
            batch=batch, tied_embeddings=bool(_field(config, "tie_word_embeddings", False)),
            head_positions=head_positions,
            qkv_bias=attention_bias if qkv_bias is None else qkv_bias, out_bias=attention_bias,
            mlp_bias=bool(_field(config, "mlp_bias", False)), norm_bias=False, name=_name(config),
        )

    @classmethod
    def from_mistral(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                     head_positions: HeadPositions = "all") -> TransformerConfig:
        """From a ``MistralConfig`` (or dict): the Llama layout; see `from_llama`."""
        return cls.from_llama(config, seq_len=seq_len, batch=batch, head_positions=head_positions)

    @classmethod
    def from_qwen2(cls, config: Any, *, seq_len: int | None = None, batch: int = 1,
                   head_positions: HeadPositions = "all") -> TransformerConfig:
        """From a ``Qwen2Config`` (or dict): the Llama layout with biases on the query, key and
        value projections (transformers' ``Qwen2Attention`` builds them with ``bias=True``)."""
        return cls.from_llama(config, seq_len=seq_len, batch=batch,
                              head_positions=head_positions, qkv_bias=True)


    @classmethod
    def from_meta_llama(cls, params: Any, *, seq_len: int | None = None, batch: int = 1,
                        head_positions: HeadPositions | None = None) -> TransformerConfig:
        """From Meta's Llama ``params.json`` (meta-llama/llama3, ``llama/model.py`` ModelArgs:
        ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``vocab_size``, ``multiple_of``,
        ``ffn_dim_multiplier``, ``max_seq_len``) or `exportflops.examples.llama.LlamaConfig`,
        which names ``ffn_dim`` and ``head_dim`` outright. Untied unless ``tie_embeddings``;
        the head on the last position when ``logits_last_only`` and ``head_positions`` is not
        given."""
        dim, heads = _field(params, "dim"), _field(params, "n_heads")
        ffn_width = _field(params, "ffn_dim", None) or meta_ffn_width(
            dim, _field(params, "multiple_of"), _field(params, "ffn_dim_multiplier", None))
        if head_positions is None:
            head_positions = "last" if _field(params, "logits_last_only", False) else "all"
        return cls(
            layers=_field(params, "n_layers"), width=dim, heads=heads,
            kv_heads=_field(params, "n_kv_heads", None) or heads,
            head_dim=_field(params, "head_dim", None), ffn_width=ffn_width, gated_ffn=True,
            vocab=_field(params, "vocab_size"),
            seq_len=_field(params, "max_seq_len") if seq_len is None else seq_len, batch=batch,
            tied_embeddings=bool(_field(params, "tie_embeddings", False)),
            head_positions=head_positions,
        )


def meta_ffn_width(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU width Meta's ``llama/model.py`` derives (FeedForward.__init__, hidden 4 dim):

    1. two thirds of 4 dim, keeping the parameter count of a 4 dim two-matrix FFN;
    2. times ``ffn_dim_multiplier`` when set (1.3 for Llama 3 8B and 70B);
    3. rounded up to a multiple of ``multiple_of``.
    """
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


class ParamCounts(Record):
    """Parameters of a `TransformerConfig`, by group."""

    token_embedding: int
    """V * d: the token table."""
    position_embedding: int
    """The learned position table (0 without one)."""
    attention: int
    """Query, key, value and output projections of every block, with their biases."""
    ffn: int
    """Feed-forward projections of every block, with their biases."""
    norms: int
    """Weights (and biases) of the two norms per block and the final norm."""
    head: int
    """The LM head's weight; 0 when tied to the token table (counted there)."""
    matmul_weights: int
    """Weights that enter a matmul: every projection of every block and the head's V * d
    (tied or not). Norm weights, biases and a position table are not matmul weights."""
    tied_embeddings: bool
    """Whether the head shares the token table."""

    @property
    def total(self) -> int:
        """Every parameter, a tied table once."""
        return (self.token_embedding + self.position_embedding + self.attention + self.ffn
                + self.norms + self.head)

    @property
    def non_embedding(self) -> int:
        """The total less the tables that are only ever gathered: the position table and an
        untied token table. A tied token table stays: the head multiplies by it (nanoGPT's
        reading of PaLM's N, transformer_sizing.ipynb)."""
        gathered = self.position_embedding + (0 if self.tied_embeddings else self.token_embedding)
        return self.total - gathered


_REQUIRED = object()


def _has(config: Any, name: str) -> bool:
    if isinstance(config, Mapping):
        return name in config
    return hasattr(config, name)


def _name(config: Any) -> str:
    """HF's checkpoint name, when the config carries one."""
    return str(_field(config, "name_or_path", "") or _field(config, "_name_or_path", ""))


def _field(config: Any, name: str, default: Any = _REQUIRED) -> Any:
    """``config.name`` or ``config[name]``: HF config objects and their ``to_dict()`` alike."""
    if isinstance(config, Mapping):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    if value is _REQUIRED:
        raise ValueError(f"the config ({type(config).__name__}) has no field {name!r}; pass a "
                         f"Hugging Face config of the family named, or build "
                         f"TransformerConfig(...) from plain numbers")
    return value
