"""The third-party tier's Flax models: Flax + optax, and HuggingFace transformers' Flax
models (registered in third_party_models.MODELS when imported).

Library imports sit inside the builders, as in third_party_models.py.
"""
from __future__ import annotations

from third_party_models import B, S, VOCAB, register, sds


# --------------------------------------------------------------------------- Flax + optax
# Models written with Flax's layers (linen and nnx), after the Flax examples, trained by
# optax optimizers beyond plain Adam.

def _classifier_steps(apply_train, apply_infer, tx, params, inputs, labels, extra=()):
    """(train, infer) for a classifier whose ``apply_train(params, inputs, *extra)`` returns
    (logits, new model state or None)."""
    import jax
    import optax

    def train_step(params, opt_state, inputs, labels, *extra):
        def loss_fn(p):
            logits, aux = apply_train(p, inputs, *extra)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, aux
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, aux

    opt_state = _initial_state(tx, params)
    return {"train": ("jax", train_step, (params, opt_state, inputs, labels, *extra)),
            "infer": ("jax", apply_infer, (params, inputs))}


def _initial_state(tx, params):
    """The optimizer's state at step 0, as arrays: ``tx.init`` of zeros shaped as the
    parameters (optax's moments and counts start at zero whatever the parameters are).
    Left as shapes, the benchmarks filled it with seeded normal floats: Adam's second moment
    started negative, and every loss was NaN from the first step."""
    import jax
    import numpy as np

    zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), params)
    return jax.tree.map(np.asarray, tx.init(zeros))


def _key_spec():
    import jax
    import numpy as np
    return jax.ShapeDtypeStruct((2,), np.uint32)  # a raw threefry key, jax.random.PRNGKey(0)


@register("flax", "flax", "vit", "flax.linen",
          "optax chain(clip_by_global_norm(1), adamw(warmup_cosine_decay_schedule))",
          dict(image=[32, 32, 3], batch=2, patch=4, hidden=32, layers=2, heads=2, mlp=64,
               classes=10, attention_dropout=0.1, classifier="gap (mean of the 64 tokens)"))
def flax_vit():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class Encoder(nn.Module):
        heads: int
        mlp: int

        @nn.compact
        def __call__(self, x, train: bool):
            y = nn.LayerNorm()(x)
            y = nn.MultiHeadDotProductAttention(num_heads=self.heads, dropout_rate=0.1,
                                                deterministic=not train)(y, y)
            x = x + y
            y = nn.LayerNorm()(x)
            y = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.mlp)(y)))
            return x + y

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(32, (4, 4), strides=(4, 4), padding="VALID")(x)
            b, h, w, c = x.shape
            x = x.reshape(b, h * w, c)
            # Global average pooling (big_vision's classifier="gap"), not a class token:
            # with one, XLA:GPU H100 (jaxlib 0.10.2) fails to compile the training step and
            # the inference: "INTERNAL: Couldn't find output tile sizes that satisfy hlo:
            # %dot = f32[130,32]{1,0} dot(...)" (2 x 65 tokens), in its Triton GEMM tiling.
            x = x + self.param("pos_embedding", nn.initializers.normal(0.02), (1, h * w, c))
            for _ in range(2):
                x = Encoder(heads=2, mlp=64)(x, train)
            return nn.Dense(10)(nn.LayerNorm()(x).mean(axis=1))

    model = ViT()
    images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((2,), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(images.shape),
                                               False))["params"]
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 1000)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.05))

    def apply_train(p, x, key):
        return model.apply({"params": p}, x, True, rngs={"dropout": key}), None

    def apply_infer(p, x):
        return model.apply({"params": p}, x, False)
    return _classifier_steps(apply_train, apply_infer, tx, params, images, labels,
                             (_key_spec(),))


@register("flax", "flax", "mlp_mixer", "flax.linen", "optax lion(1e-4)",
          dict(image=[32, 32, 3], batch=2, patch=4, hidden=32, tokens_mlp=32, channels_mlp=64,
               blocks=2, classes=10))
def flax_mlp_mixer():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class MlpBlock(nn.Module):
        dim: int

        @nn.compact
        def __call__(self, x):
            return nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.dim)(x)))

    class Mixer(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(32, (4, 4), strides=(4, 4), padding="VALID")(x)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            for _ in range(2):
                y = nn.LayerNorm()(x).swapaxes(1, 2)
                x = x + MlpBlock(32)(y).swapaxes(1, 2)
                x = x + MlpBlock(64)(nn.LayerNorm()(x))
            return nn.Dense(10)(nn.LayerNorm()(x).mean(axis=1))

    model = Mixer()
    images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((2,), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                               jnp.zeros(images.shape)))["params"]

    def apply_infer(p, x):
        return model.apply({"params": p}, x)
    return _classifier_steps(lambda p, x: (apply_infer(p, x), None), apply_infer,
                             optax.lion(1e-4), params, images, labels)


@register("flax", "flax", "resnet", "flax.linen",
          "optax chain(add_decayed_weights(1e-4), sgd(0.1, momentum=0.9, nesterov=True))",
          dict(image=[32, 32, 3], batch=4, stem=16, stages=[16, 32], blocks_per_stage=1,
               norm="BatchNorm (batch_stats updated)", classes=10))
def flax_resnet():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class Block(nn.Module):
        filters: int
        strides: int

        @nn.compact
        def __call__(self, x, train: bool):
            norm = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9)  # noqa: E731
            y = nn.relu(norm()(nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(x)))
            y = norm()(nn.Conv(self.filters, (3, 3), use_bias=False)(y))
            if x.shape != y.shape:
                x = norm()(nn.Conv(self.filters, (1, 1), self.strides, use_bias=False)(x))
            return nn.relu(x + y)

    class ResNet(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(16, (3, 3), use_bias=False)(x)
            x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
            x = Block(16, 1)(x, train)
            x = Block(32, 2)(x, train)
            return nn.Dense(10)(x.mean(axis=(1, 2)))

    model = ResNet()
    images = jax.ShapeDtypeStruct((4, 32, 32, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((4,), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                                  jnp.zeros(images.shape), False))
    tx = optax.chain(optax.add_decayed_weights(1e-4),
                     optax.sgd(0.1, momentum=0.9, nesterov=True))

    def apply_train(p, x, batch_stats):
        logits, new = model.apply({"params": p, "batch_stats": batch_stats}, x, True,
                                  mutable=["batch_stats"])
        return logits, new["batch_stats"]

    def apply_infer(variables, x):
        return model.apply(variables, x, False)
    steps = _classifier_steps(apply_train, apply_infer, tx, variables["params"], images, labels,
                              (variables["batch_stats"],))
    steps["infer"] = ("jax", apply_infer, (variables, images))
    return steps


@register("flax", "flax", "lstm", "flax.linen", "optax rmsprop(1e-3, momentum=0.9)",
          dict(vocab=VOCAB, batch=B, seq=S, embed=32, hidden=32, cell="OptimizedLSTMCell",
               layers="nn.RNN (scan)", classes=4))
def flax_lstm():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class Classifier(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, 32)(tokens)
            x = nn.RNN(nn.OptimizedLSTMCell(32))(x)
            return nn.Dense(4)(x[:, -1])

    model = Classifier()
    tokens = jax.ShapeDtypeStruct((B, S), jnp.int32)
    labels = jax.ShapeDtypeStruct((B,), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                               jnp.zeros(tokens.shape, jnp.int32)))["params"]

    def apply_infer(p, x):
        return model.apply({"params": p}, x)
    return _classifier_steps(lambda p, x: (apply_infer(p, x), None), apply_infer,
                             optax.rmsprop(1e-3, momentum=0.9), params, tokens, labels)


def _sinusoidal_table(max_len: int, features: int):
    """The Flax WMT example's ``sinusoidal_init``: a numpy table, a constant of the module."""
    import numpy as np

    position = np.arange(max_len)[:, None]
    div_term = np.exp(np.arange(0, features, 2) * -(np.log(10000.0) / features))
    table = np.zeros((max_len, features), np.float32)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term)
    return table


@register("flax", "flax", "nnx_gpt", "flax.nnx", "optax adafactor(1e-3)",
          dict(vocab=VOCAB, batch=B, seq=S, hidden=32, heads=2, mlp=64, layers=2,
               mask="causal (nnx.make_causal_mask)",
               positions="sinusoidal table from numpy (the Flax WMT example's sinusoidal_init)"))
def flax_nnx_gpt():
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1, self.ln2 = nnx.LayerNorm(32, rngs=rngs), nnx.LayerNorm(32, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=32, decode=False,
                                               rngs=rngs)
            self.up, self.down = nnx.Linear(32, 64, rngs=rngs), nnx.Linear(64, 32, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class GPT(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, 32, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(2)])
            self.ln = nnx.LayerNorm(32, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + _sinusoidal_table(64, 32)[None, :tokens.shape[1]]
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.embed.attend(self.ln(x))  # tied output embedding

    graphdef, params = nnx.split(nnx.eval_shape(lambda: GPT(nnx.Rngs(0))), nnx.Param)
    tx = optax.adafactor(1e-3)

    def forward(p, tokens):
        return nnx.merge(graphdef, p)(tokens)

    def train_step(p, opt_state, tokens):
        def loss_fn(p):
            logits = forward(p, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    params = sds(params)
    tokens = jax.ShapeDtypeStruct((B, S + 1), jnp.int32)
    return {"train": ("jax", train_step, (params, _initial_state(tx, params), tokens)),
            "infer": ("jax", forward, (params, jax.ShapeDtypeStruct((B, S), jnp.int32)))}


# --------------------------------------------------------------------------- HF transformers (Flax)
# transformers 4.x Flax models from a config (``_do_init=False``: no weights materialize,
# none are downloaded), trained with optax as the HuggingFace Flax examples do.

def _hf_model(cls_name: str, config_name: str, **config):
    import transformers
    cfg = getattr(transformers, config_name)(**config)
    return getattr(transformers, cls_name)(cfg, seed=0, _do_init=False)


def _hf_params(model, input_shape):
    import jax
    return jax.eval_shape(lambda: model.init_weights(jax.random.PRNGKey(0), input_shape))


def _hf_causal_lm_steps(model, tx):
    """Steps of a HuggingFace Flax causal LM on token ids: next-token cross-entropy."""
    import jax
    import jax.numpy as jnp
    import optax

    params = _hf_params(model, (B, S))
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def forward(p, input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask, params=p, train=False).logits

    def loss_fn(p, input_ids, attention_mask):
        logits = model(input_ids, attention_mask=attention_mask, params=p, train=True,
                       dropout_rng=jax.random.PRNGKey(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], input_ids[:, 1:]).mean()
    return _hf_steps(loss_fn, forward, tx, params, (ids, ids))


def _hf_steps(loss_fn, forward, tx, params, batch):
    """``loss_fn(params, *batch)``; ``forward(params, *batch)``: train step with optax."""
    import jax
    import optax

    def train_step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return {"train": ("jax", train_step, (params, _initial_state(tx, params), *batch)),
            "infer": ("jax", forward, (params, *batch))}


@register("transformers", "transformers", "gpt2", "jax (flax.linen)",
          "optax adamw(1e-3, weight_decay=0.01)",
          dict(model="FlaxGPT2LMHeadModel", vocab_size=VOCAB, n_positions=64, n_embd=32,
               n_layer=2, n_head=2, n_inner=64, dropout=0.0, batch=B, seq=S))
def transformers_gpt2():
    import optax

    model = _hf_model("FlaxGPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_positions=64,
                      n_embd=32, n_layer=2, n_head=2, n_inner=64, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0)
    return _hf_causal_lm_steps(model, optax.adamw(1e-3, weight_decay=0.01))


@register("transformers", "transformers", "llama", "jax (flax.linen)",
          "optax chain(clip_by_global_norm(1), adamw(1e-3))",
          dict(model="FlaxLlamaForCausalLM", vocab_size=VOCAB, hidden_size=32,
               intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, batch=B, seq=S,
               rope="sin/cos table from numpy (create_sinusoidal_positions)"))
def transformers_llama():
    import optax

    model = _hf_model("FlaxLlamaForCausalLM", "LlamaConfig", vocab_size=VOCAB, hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return _hf_causal_lm_steps(
        model, optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)))


@register("transformers", "transformers", "bert", "jax (flax.linen)",
          "optax adamw(linear_schedule(1e-3 -> 0, 1000))",
          dict(model="FlaxBertForSequenceClassification", vocab_size=VOCAB, hidden_size=32,
               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=64, num_labels=4, dropout=0.0, batch=B, seq=S))
def transformers_bert():
    import jax
    import jax.numpy as jnp
    import optax

    model = _hf_model("FlaxBertForSequenceClassification", "BertConfig", vocab_size=VOCAB,
                      hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, num_labels=4,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    params = _hf_params(model, (B, S))
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)
    labels = jax.ShapeDtypeStruct((B,), jnp.int32)

    def forward(p, input_ids, attention_mask, labels=None):
        return model(input_ids, attention_mask=attention_mask, params=p, train=False).logits

    def loss_fn(p, input_ids, attention_mask, labels):
        logits = model(input_ids, attention_mask=attention_mask, params=p, train=True,
                       dropout_rng=jax.random.PRNGKey(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    steps = _hf_steps(loss_fn, forward, optax.adamw(optax.linear_schedule(1e-3, 0.0, 1000)),
                      params, (ids, ids, labels))
    steps["infer"] = ("jax", forward, (params, ids, ids))
    return steps


@register("transformers", "transformers", "t5", "jax (flax.linen)", "optax adafactor(1e-3)",
          dict(model="FlaxT5ForConditionalGeneration", vocab_size=VOCAB, d_model=32, d_kv=16,
               d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2, dropout=0.0,
               batch=B, source_seq=S, target_seq=8))
def transformers_t5():
    import jax
    import jax.numpy as jnp
    import optax

    model = _hf_model("FlaxT5ForConditionalGeneration", "T5Config", vocab_size=VOCAB,
                      d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=2, dropout_rate=0.0, decoder_start_token_id=0)
    params = _hf_params(model, (B, S))
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)
    targets = jax.ShapeDtypeStruct((B, 8), jnp.int32)

    def forward(p, input_ids, decoder_input_ids, labels=None):
        return model(input_ids, decoder_input_ids=decoder_input_ids, params=p,
                     train=False).logits

    def loss_fn(p, input_ids, decoder_input_ids, labels):
        logits = model(input_ids, decoder_input_ids=decoder_input_ids, params=p, train=True,
                       dropout_rng=jax.random.PRNGKey(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    steps = _hf_steps(loss_fn, forward, optax.adafactor(1e-3), params, (ids, targets, targets))
    steps["infer"] = ("jax", forward, (params, ids, targets))
    return steps
