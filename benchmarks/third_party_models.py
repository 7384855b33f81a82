"""The third-party tier's models: each ``@register``ed builder returns, per mode, the
function to compile and its arguments (shapes only). Read by benchmarks/make_third_party.py;
the Flax ones are in third_party_flax.py.

Library imports sit inside the builders: a builder runs only in the child process of its
library (make_third_party.py ``--part``), after that child has chosen the Keras backend.
"""
from __future__ import annotations

MODES = ("train", "infer")


def sds(tree):
    """Arrays (and Keras variables) -> jax.ShapeDtypeStruct leaves."""
    import jax
    import numpy as np

    def leaf(x):
        x = getattr(x, "value", x)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    return jax.tree.map(leaf, tree)


def values(variables) -> list:
    """Keras variables -> their values as numpy arrays: the state a job starts from."""
    import numpy as np

    return [np.asarray(getattr(v, "value", v)) for v in variables]


# =========================================================================== model registry

MODELS: dict[str, dict] = {}  # model key -> {part, library, model, framework, build, ...}


def register(part: str, library: str, model: str, framework: str, optimizer: str, config: dict,
             modes=MODES):
    """Decorator: ``build()`` returns {mode: (kind, fn, args)}, kind "jax" or "tf"."""
    def wrap(build):
        MODELS[f"{library}_{model}"] = dict(part=part, library=library, model=model,
                                            framework=framework, optimizer=optimizer,
                                            config=config, modes=modes, build=build)
        return build
    return wrap


# --------------------------------------------------------------------------- Keras Hub (JAX)
# Tasks built around a backbone from constructor arguments (preprocessor=None: token ids in),
# compiled with a Keras optimizer; the train step is Keras's own JAX ``train_step`` (loss,
# metrics, optimizer.stateless_apply), the function ``model.fit`` jits.

B, S, VOCAB = 2, 16, 256
LM = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=32, intermediate_dim=64)


def _keras_hub_task(task_cls, backbone_cls, backbone_kwargs, optimizer, task_kwargs=None,
                    loss=None):
    import keras
    import keras_hub
    import numpy as np

    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, backbone_cls)(**backbone_kwargs)
    task = getattr(keras_hub.models, task_cls)(backbone=backbone, preprocessor=None,
                                               **(task_kwargs or {}))
    compile_kwargs = {"optimizer": optimizer}
    if loss is not None:
        compile_kwargs["loss"] = loss
    task.compile(**compile_kwargs)
    x = {"token_ids": np.zeros((B, S), np.int32), "padding_mask": np.ones((B, S), bool)}
    if task_cls.endswith("CausalLM"):
        y, sw = np.zeros((B, S), np.int32), np.ones((B, S), np.float32)
    else:
        y, sw = np.zeros((B,), np.int32), np.ones((B,), np.float32)
    task.optimizer.build(task.trainable_variables)
    task._symbolic_build(data_batch=(x, y, sw))  # what fit() does first: metrics, loss state
    # random weights (filled by the caller); the rest as fit() starts: optimizer moments,
    # counters and metrics at zero (random values made Adam's second moment negative)
    state = (sds(task.trainable_variables), values(task.non_trainable_variables),
             values(task.optimizer.variables), values(task.metrics_variables))
    data = (sds(x), sds(y), sw)  # weights of 1, as fit() passes none: seeded normal
    # weights made the loss negative, and its minimization run away
    return {"train": ("jax", task.train_step, (state, data)),
            "infer": ("jax", task.predict_step, (state[:2], (sds(x),)))}


def _keras_optimizer(name: str, **kwargs):
    import keras
    return getattr(keras.optimizers, name)(**kwargs)


@register("keras_hub", "keras_hub", "gpt2", "jax", "keras AdamW(1e-3, weight_decay=0.01)",
          dict(task="GPT2CausalLM", **LM, num_heads=2, dropout=0.1, max_sequence_length=64))
def keras_hub_gpt2():
    return _keras_hub_task("GPT2CausalLM", "GPT2Backbone",
                           dict(**LM, num_heads=2, dropout=0.1, max_sequence_length=64),
                           _keras_optimizer("AdamW", learning_rate=1e-3, weight_decay=0.01))


@register("keras_hub", "keras_hub", "llama", "jax", "keras Lion(1e-4)",
          dict(task="LlamaCausalLM", **LM, num_query_heads=4, num_key_value_heads=2))
def keras_hub_llama():
    return _keras_hub_task("LlamaCausalLM", "LlamaBackbone",
                           dict(**LM, num_query_heads=4, num_key_value_heads=2),
                           _keras_optimizer("Lion", learning_rate=1e-4))


@register("keras_hub", "keras_hub", "gemma", "jax", "keras Adafactor(1e-3)",
          dict(task="GemmaCausalLM", **LM, num_query_heads=2, num_key_value_heads=1,
               head_dim=16))
def keras_hub_gemma():
    return _keras_hub_task("GemmaCausalLM", "GemmaBackbone",
                           dict(**LM, num_query_heads=2, num_key_value_heads=1, head_dim=16),
                           _keras_optimizer("Adafactor", learning_rate=1e-3))


@register("keras_hub", "keras_hub", "mistral", "jax", "keras Adam(1e-3)",
          dict(task="MistralCausalLM", **LM, num_query_heads=4, num_key_value_heads=2,
               sliding_window=8))
def keras_hub_mistral():
    return _keras_hub_task("MistralCausalLM", "MistralBackbone",
                           dict(**LM, num_query_heads=4, num_key_value_heads=2, sliding_window=8),
                           _keras_optimizer("Adam", learning_rate=1e-3))


@register("keras_hub", "keras_hub", "mixtral", "jax", "keras Lamb(1e-3)",
          dict(task="MixtralCausalLM", **LM, num_query_heads=4, num_key_value_heads=2,
               num_experts=4, top_k=2, sliding_window=8))
def keras_hub_mixtral():
    return _keras_hub_task("MixtralCausalLM", "MixtralBackbone",
                           dict(**LM, num_query_heads=4, num_key_value_heads=2, num_experts=4,
                                top_k=2, sliding_window=8),
                           _keras_optimizer("Lamb", learning_rate=1e-3))


@register("keras_hub", "keras_hub", "roberta", "jax", "keras AdamW(1e-3)",
          dict(task="RobertaTextClassifier", num_classes=4, **LM, num_heads=2, dropout=0.0,
               max_sequence_length=64))
def keras_hub_roberta():
    import keras
    return _keras_hub_task("RobertaTextClassifier", "RobertaBackbone",
                           dict(**LM, num_heads=2, dropout=0.0, max_sequence_length=64),
                           _keras_optimizer("AdamW", learning_rate=1e-3),
                           task_kwargs={"num_classes": 4, "dropout": 0.0},
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


@register("keras_hub", "keras_hub", "distilbert", "jax", "keras RMSprop(1e-3)",
          dict(task="DistilBertTextClassifier", num_classes=4, **LM, num_heads=2, dropout=0.0,
               max_sequence_length=64))
def keras_hub_distilbert():
    import keras
    return _keras_hub_task("DistilBertTextClassifier", "DistilBertBackbone",
                           dict(**LM, num_heads=2, dropout=0.0, max_sequence_length=64),
                           _keras_optimizer("RMSprop", learning_rate=1e-3),
                           task_kwargs={"num_classes": 4, "dropout": 0.0},
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


# ------------------------------------------------------------------------- Keras Applications (TF)
# keras.applications (tf.keras in TF 2.16+) with weights=None on the TensorFlow backend; the
# train step is Keras's own TF ``train_step`` inside tf.function(jit_compile=True), as
# ``fit`` runs it with ``jit_compile=True``; inference is ``predict_step``.

IMAGE = (32, 32, 3)  # the smallest input keras.applications accepts
IMAGE_BATCH = 2


def _keras_application(name: str, optimizer: str, ctor_kwargs: dict):
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=IMAGE, classes=10,
                                              **ctor_kwargs)
    model.compile(optimizer=_keras_optimizer(optimizer, learning_rate=1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(), jit_compile=True)
    x = np.zeros((IMAGE_BATCH, *IMAGE), np.float32)
    y = np.zeros((IMAGE_BATCH,), np.int32)
    model.optimizer.build(model.trainable_variables)
    model._symbolic_build(data_batch=(x, y))
    train = tf.function(lambda x, y: model.train_step((x, y)), jit_compile=True)
    infer = tf.function(lambda x: model.predict_step((x,)), jit_compile=True)
    x_spec, y_spec = tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(y.shape, tf.int32)
    return {"train": ("tf", train, (x_spec, y_spec)), "infer": ("tf", infer, (x_spec,))}


# (file name, keras.applications constructor, optimizer, constructor kwargs). Training
# steps of these are 1-1.3 MB of text (120-160 KB gzipped) per target whatever the width
# (ResNet50V2, MobileNetV2 alpha=0.35 measured alike): two architectures only.
KERAS_APPS = [
    ("mobilenet_v3_small", "MobileNetV3Small", "SGD", {}),
    ("convnext_tiny", "ConvNeXtTiny", "AdamW", {}),
]
for _name, _ctor, _opt, _kwargs in KERAS_APPS:
    register("keras", "keras", _name, "tf", f"keras {_opt}(1e-3)",
             dict(application=_ctor, input_shape=list(IMAGE), batch=IMAGE_BATCH, classes=10,
                  **_kwargs))(
        lambda _ctor=_ctor, _opt=_opt, _kwargs=_kwargs: _keras_application(_ctor, _opt, _kwargs))
