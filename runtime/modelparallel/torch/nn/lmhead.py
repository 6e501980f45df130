"""``smp.nn.DistributedTransformerLMHead``: embeddings, a ``DistributedTransformer`` and a
language-model head tied to the word embedding.

Parameters: ``word_embedding.weight`` (``[vocab, hidden]``, a ``DistributedEmbedding``:
hidden columns split over the TP group), ``position_embedding.weight``
(``[num_positions, hidden]``, whole) unless ``use_positional_embedding=False``,
``token_type_embedding.weight`` (``[num_token_types, hidden]``, whole) when
``num_token_types > 0``, ``transformer.seq_layers.<i>.*``, and ``layernorm`` (the final
layer normalisation; by default present for pre-layernorm stacks, which otherwise end
un-normalised). The head has no parameter of its own: ``logits = h @ word_embedding.weight^T``;
with ``tie_input_output_embedding=False`` it is ``lm_head.weight`` (``[vocab, hidden]``,
hidden columns split like the word embedding's) and, with ``lm_head_bias``, ``lm_head.bias``
(``[vocab]``, whole; GPT-J's).

``forward(inputs)``: ``inputs = (input_ids, attention_mask, token_type_ids, position_ids,
labels)`` (cross-attention: ``cross_states, cross_mask`` before ``labels``); trailing items
may be left out. ``attention_mask`` is ``[N, S]`` with 1 at masked positions (SMP's
convention), turned into ``mask_value`` added to the scores. Returns the logits ``[N, S,
vocab]``, or ``(loss, logits)`` with labels: the causal LM loss, position t predicting label
t+1, mean over the tokens (``-100`` ignored). Without ``add_lm_head`` it returns the last
hidden states.

Layout: each rank embeds its own rows; the whole stack runs in the block layout
(``layout.py``); the final LayerNorm too; the head multiplies this rank's hidden channels by
its columns of the word embedding and reduce-scatters the partial logits over the group's
rows (all-reduce when the batch is prescaled), so no hidden states go back first. The
position and token-type embeddings are whole on every rank but used only on its rows: their
gradients are summed over the group (``copy_to``) so that, like every parameter of a
distributed module, they carry the gradient of the group's whole batch.

With ``prescaled_batch`` (tp > 1) the head works on this rank's part of the sequence, as
SMP's does: the logits are ``[S/tp, N, vocab]`` (sequence first: rank r holds positions
``r*S/tp`` to ``(r+1)*S/tp``; scripts concatenate them on dim 0), and the loss is the mean
over those positions' tokens, whose gradients add up over the group to the whole batch's.
The sequence length must be a multiple of the TP degree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from shoal.modelparallel.errors import InvalidSeqLenPrescaledBatchError, SMPUnsupportedError
from shoal.modelparallel.torch.nn import rotary
from shoal.modelparallel.torch.nn.dropout import ParallelDropout
from shoal.modelparallel.torch.nn.embedding import DistributedEmbedding
from shoal.modelparallel.torch.nn.layout import Layout
from shoal.modelparallel.torch.nn.module import DistributedModule
from shoal.modelparallel.torch.nn.options import check_causal_mask, check_extra
from shoal.modelparallel.torch.nn.projection import ParallelLinear
from shoal.modelparallel.torch.nn.transformer import DistributedTransformer
from shoal.modelparallel.torch.tensorparallel import collectives as tp

_SEQUENCE = ("Sequence length must be greater than and divisible by the tensor parallelism "
             "degree when prescaled_batch is True.")


def _check_prescaled_sequence(seq: int, tp_size: int) -> None:
    if seq < tp_size or seq % tp_size:
        raise InvalidSeqLenPrescaledBatchError(_SEQUENCE)


class DistributedTransformerLMHead(DistributedModule):
    # Children whose weights the forward reads without calling them (the embedding tables,
    # the output projection): sharded data parallelism gathers them with this module's own.
    reads_children_parameters = ("word_embedding", "position_embedding",
                                 "token_type_embedding", "lm_head")

    def __init__(self, num_layers: int = 12, num_attention_heads: int = 32,
                 attention_head_size: int = 32, hidden_size: int = 1024,
                 intermediate_size: int = 4096, vocab_size: int = 30522,
                 num_positions: int = 1024, attention_dropout_prob: float = 0.1,
                 hidden_dropout_prob: float = 0.1, activation: str = "gelu",
                 layernorm_epsilon: float = 1e-5, num_token_types: int = 0,
                 causal_mask_size: int | None = None, add_cross_attention: bool = False,
                 add_lm_head: bool = True, initializer_range: float = 0.02,
                 use_normal_initialization: bool = False, pre_layernorm: bool = False,
                 post_layernorm: bool = True, embedding_dropout_prob: float = 0.1,
                 use_positional_embedding: bool = True, final_layernorm: bool | None = None,
                 mask_value: float = -1e4, scale_attention_scores: bool = True,
                 fp32_residual_addition: bool = False,
                 tie_input_output_embedding: bool = True, lm_head_bias: bool = False,
                 **extra) -> None:
        super().__init__()
        check_extra(type(self).__name__, extra, passes_on=True)
        check_causal_mask(causal_mask_size, num_positions)
        self.hidden_size, self.vocab_size = int(hidden_size), int(vocab_size)
        self.add_cross_attention, self.add_lm_head = bool(add_cross_attention), bool(add_lm_head)
        self.mask_value = float(mask_value)
        self.layout = Layout(self.hidden_size)
        std = initializer_range if use_normal_initialization else None
        self._build_embeddings(num_positions if use_positional_embedding else 0,
                               int(num_token_types), std)
        self.tie_input_output_embedding = bool(tie_input_output_embedding)
        self._build_head(bool(lm_head_bias), std)
        self.embedding_dropout = ParallelDropout(embedding_dropout_prob)
        self.transformer = DistributedTransformer(
            num_layers=num_layers, num_attention_heads=num_attention_heads,
            attention_head_size=attention_head_size, hidden_size=hidden_size,
            intermediate_size=intermediate_size, attention_dropout_prob=attention_dropout_prob,
            hidden_dropout_prob=hidden_dropout_prob, activation=activation,
            layernorm_epsilon=layernorm_epsilon, initializer_range=initializer_range,
            use_normal_initialization=use_normal_initialization,
            causal_mask_size=causal_mask_size, add_cross_attention=add_cross_attention,
            pre_layernorm=pre_layernorm, post_layernorm=post_layernorm, mask_value=mask_value,
            scale_attention_scores=scale_attention_scores,
            fp32_residual_addition=fp32_residual_addition, **extra)
        self.transformer.set_layout_boundaries(False)
        if final_layernorm is None:
            final_layernorm = pre_layernorm and not post_layernorm
        self.layernorm = self.layout.layernorm(float(layernorm_epsilon)) if final_layernorm else None

    def _build_embeddings(self, positions: int, token_types: int, std: float | None) -> None:
        self.word_embedding = DistributedEmbedding(self.vocab_size, self.hidden_size)
        if std is not None:
            self.word_embedding.init_shard(
                self.word_embedding.weight, "weight", (self.vocab_size, self.hidden_size),
                lambda w: torch.nn.init.normal_(w, 0.0, std))
        self.position_embedding = self._whole_embedding(positions, std) if positions else None
        self.token_type_embedding = self._whole_embedding(token_types, std) if token_types else None

    def _build_head(self, bias: bool, std: float | None) -> None:
        if self.tie_input_output_embedding:
            if bias:
                raise SMPUnsupportedError("lm_head_bias=True needs tie_input_output_embedding=False")
            self.lm_head = None
            return
        self.lm_head = ParallelLinear(self.hidden_size, self.vocab_size, "row",
                                      in_sizes=self.layout.hidden_sizes, normal_std=std, bias=bias)

    def _whole_embedding(self, rows: int, std: float | None) -> torch.nn.Embedding:
        table = torch.nn.Embedding(rows, self.hidden_size)
        if std is not None:
            torch.nn.init.normal_(table.weight, 0.0, std)
        return table

    # -- forward ------------------------------------------------------------------------
    def forward(self, inputs):
        ids, mask, token_types, positions, cross, cross_mask, labels = self._unpack(inputs)
        rows = ids.shape[0]
        x = self._embed(ids, token_types, positions)
        layout = self.layout
        state = [layout.enter(x), layout.enter_mask(self._additive(mask), rows)]
        if self.add_cross_attention:
            state = [state[0], layout.enter(cross) if cross is not None else None, state[1],
                     layout.enter_mask(self._additive(cross_mask), rows)]
        rotary_positions = layout.enter_mask(positions, rows) if positions is not None else None
        with rotary.given_positions(rotary_positions):
            hidden = self.transformer.seq_layers(tuple(state))[0]
        if self.layernorm is not None:
            hidden = self.layernorm(hidden)
        if not self.add_lm_head:
            return layout.leave(hidden)
        logits = self._logits(hidden, rows)
        if labels is None:
            return logits
        return self._loss(logits, labels), logits

    def _unpack(self, inputs):
        items = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
        width = 7 if self.add_cross_attention else 5
        if not 1 <= len(items) <= width:
            raise ValueError(f"DistributedTransformerLMHead takes 1 to {width} inputs, "
                             f"got {len(items)}")
        items += [None] * (width - len(items))
        if not self.add_cross_attention:
            items[4:4] = [None, None]
        return items

    def _embed(self, ids, token_types, positions) -> torch.Tensor:
        x = self.word_embedding(ids)
        if self.position_embedding is not None:
            if positions is None:
                positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            x = x + F.embedding(positions, self._group_grad(self.position_embedding.weight))
        if self.token_type_embedding is not None and token_types is not None:
            x = x + F.embedding(token_types, self._group_grad(self.token_type_embedding.weight))
        # Own rows are this rank's data; a prescaled batch is the group's, dropped alike.
        return self.embedding_dropout(x, local=not self.layout.prescaled)

    def _group_grad(self, weight: torch.Tensor) -> torch.Tensor:
        """A whole parameter used on this rank's rows only: its gradient summed over the
        group, as if it had seen the group's batch."""
        return tp.copy_to(weight) if self.layout.gathers_rows else weight

    def _additive(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """A ``[N, S]`` 0/1 mask (1 = masked) -> ``[N, 1, 1, S]`` added to the scores; a
        mask of another rank is taken as already additive."""
        if mask is None or mask.dim() != 2:
            return mask
        return mask[:, None, None, :].to(torch.get_default_dtype()) * self.mask_value

    def _logits(self, hidden: torch.Tensor, rows: int) -> torch.Tensor:
        head = self.lm_head
        weight = self.word_embedding.weight if head is None else head.weight
        bias = None if head is None or head.bias is None else head.bias
        layout = self.layout
        if layout.tp_size == 1:
            return F.linear(hidden, weight, bias)
        if not layout.memory:
            hidden = tp.scatter(hidden, -1, layout.hidden_sizes)
        partial = F.linear(hidden, weight)
        if layout.prescaled:
            # SMP's layout: this rank's positions of the sequence, sequence first.
            seq = hidden.shape[1]
            _check_prescaled_sequence(seq, layout.tp_size)
            logits = tp.reduce_scatter(partial, 1, [seq // layout.tp_size] * layout.tp_size)
            if bias is not None:  # whole, added to this rank's positions
                logits = logits + tp.copy_to(bias)
            return logits.transpose(0, 1)
        logits = tp.reduce_scatter(partial, 0, [rows] * layout.tp_size)
        # The bias is whole and added to this rank's rows: its gradient summed as the group's.
        return logits + self._group_grad(bias) if bias is not None else logits

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.layout.prescaled and self.layout.tp_size > 1:
            return self._sequence_shard_loss(logits, labels)
        shifted = logits[:, :-1, :].reshape(-1, logits.shape[-1])
        return F.cross_entropy(shifted, labels[:, 1:].reshape(-1))

    def _sequence_shard_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's positions ``[S/tp, N, vocab]`` (position t predicts label
        t+1; the last position predicts nothing). Its value is the mean over this rank's
        tokens; its gradient is that of the whole sequence's mean loss, so the group's
        backwards add up to the batch's gradient whatever the tokens' spread over ranks."""
        tp_size, rank = self.layout.tp_size, self.tp_rank()
        width = labels.shape[1] // tp_size
        targets = F.pad(labels[:, 1:], (0, 1), value=-100)
        mine = targets[:, rank * width:(rank + 1) * width].transpose(0, 1)
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine.reshape(-1),
                                reduction="sum")
        everywhere = (targets != -100).sum().clamp(min=1)
        here = (mine != -100).sum().clamp(min=1)
        weighted = total / everywhere
        return weighted + (total / here - weighted).detach()

    def extra_repr(self) -> str:
        return (f"vocab={self.vocab_size}, hidden={self.hidden_size}, "
                f"optimize={self.layout.optimize}, tp_size={self.tp_size()}")
