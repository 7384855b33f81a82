"""Regenerate the third-party tier of the HLO corpus: tests/data/hlo/third_party/.

    python benchmarks/make_third_party.py              # all models; ~7 minutes on 2 cores
    python benchmarks/make_third_party.py -j 2         # two libraries at a time: ~4 minutes
    python benchmarks/make_third_party.py --only gpt2 llama   # just these (others kept)

Models from maintained third-party libraries, at tiny but real configurations (2 layers,
hidden size 32, sequences of 16 tokens, 32x32 images, batch 2-4), with random weights built
from constructor arguments: nothing is downloaded (no presets, no checkpoints). For each
model, the optimized HLO of

- ``train``: one full training step as the library itself writes it: forward, backward and
  the library's own optimizer update (Keras: ``model.train_step``, what ``model.fit`` jits,
  with a Keras optimizer; Flax and HuggingFace Flax models: ``jax.value_and_grad`` + an
  optax optimizer);
- ``infer``: the forward pass at inference (Keras: ``model.predict_step``),

for XLA:CPU and XLA:GPU H100 (deviceless compilation, XLA's default flags), each written
twice: as ``as_text()`` prints it (large constants elided as ``{...}``; file suffix
``_elided``) and with every constant in full (as fusionstitching.capture prints it). Where the
two texts are identical (no constant large enough to be elided) only the full file is written
and the manifest lists the elided name with ``"identical_to"`` (the two printers may still
differ in the key order of a backend_config's JSON: the elided file is as_text()'s own).

The Keras backend is chosen once per process, so each library runs in its own child process
(``--part``): Keras Hub on the JAX backend, Keras Applications on the TensorFlow backend (TF's
own XLA bridge: ``tf.function(jit_compile=True)``), Flax + optax, HuggingFace transformers'
Flax models. Each child sets JAX_PLATFORMS=cpu before JAX starts, so deviceless XLA:GPU
compiles run in that process (fusionstitching.capture needs no grandchild).

Files: ``<library>_<model>_<mode>_<target>[_elided].hlo[.gz]``; modules over 64 KiB of text
lose XLA's ``metadata={...}`` (op names and source lines: debug information only) and the
stack-frame tables only that metadata refers to, then are gzipped (no time stamp, so a rerun
gives the same bytes). A capture that fails is listed in manifest.json with
``"skipped": reason`` instead of a file.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "tests" / "data" / "hlo" / "third_party"
REGENERATE = "python benchmarks/make_third_party.py"
COMPRESS_ABOVE = 64 * 1024  # bytes of HLO text; above it: metadata stripped, gzipped
TARGETS = ("cpu", "h100")
MODES = ("train", "infer")

# part -> (the distributions whose versions the manifest records, environment of its child).
PARTS = {
    "keras_hub": (("keras-hub", "keras", "jax"), {"KERAS_BACKEND": "jax"}),
    "keras": (("keras", "tensorflow"), {"KERAS_BACKEND": "tensorflow"}),
    "flax": (("flax", "optax", "jax"), {}),
    "transformers": (("transformers", "flax", "optax", "jax"), {}),
}


# =========================================================================== capture helpers

def _capture():
    from fusionstitching import capture
    return capture


def jax_texts(fn, args, target: str) -> tuple[str, str]:
    """(as_text() with constants elided, text with constants in full) of ``jax.jit(fn)`` for
    abstract ``args`` on ``target``: one compile, printed both ways."""
    import jax

    from fusionstitching.hlo.xla_runner import optimized_hlo_text

    capture = _capture()
    device = jax.devices("cpu")[0] if target == "cpu" else capture._gpu_device(target)
    sharding = jax.sharding.SingleDeviceSharding(device)

    def abstract(leaf):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    traced = jax.jit(fn).trace(*jax.tree.map(abstract, args))
    compiled = traced.lower().compile(capture._compiler_options(target, False, None))
    return compiled.as_text(), optimized_hlo_text(compiled)


def tf_texts(fn, specs, target: str) -> tuple[str, str]:
    """The same for a ``tf.function(jit_compile=True)``: XLA:CPU through TF itself (TF prints
    the elided text, the serialized proto gives the full one), XLA:GPU through TF's
    pre-optimization HLO and jaxlib's deviceless compiler (as capture.tf_hlo_for_gpu)."""
    capture = _capture()
    if target == "cpu":
        elided = fn.experimental_get_compiler_ir(*specs)(stage="optimized_hlo")
        return elided, capture.tf_hlo(fn, *specs)
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    from fusionstitching.hlo.xla_runner import hlo_module_text

    hlo = capture.tf_hlo(fn, *specs, stage="hlo")
    device = capture._gpu_device(target)
    proto = xc.hlo.hlo_module_from_text(capture._route_around_copies(hlo))
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    options = compiler.get_compile_options(
        num_replicas=1, num_partitions=1,
        env_options_overrides=capture._compiler_options(target, False, None))
    with mlir.make_ir_context():
        executable = device.client.compile(
            ir.Module.parse(stablehlo), executable_devices=xc.DeviceList((device,)),
            compile_options=options)
    modules = executable.hlo_modules()
    return ("\n\n".join(m.to_string() for m in modules),
            "\n\n".join(hlo_module_text(m) for m in modules))


def sds(tree):
    """Arrays (and Keras variables) -> jax.ShapeDtypeStruct leaves."""
    import jax
    import numpy as np

    def leaf(x):
        x = getattr(x, "value", x)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
    return jax.tree.map(leaf, tree)


# =========================================================================== text handling

# `, metadata={...}` with quoted strings inside (which may hold braces).
_METADATA = re.compile(r', metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
# The tables only metadata's stack_frame_id refers to (a JAX-printed module's header).
_FRAME_SECTIONS = re.compile(
    r"^(?:FileNames|FunctionNames|FileLocations|StackFrames)\n(?:.+\n)*\n", re.M)
# TF's absolute source paths, made relative to the installation.
_SITE_PACKAGES = re.compile(r'(source_file=")[^"]*?/(?:site|dist)-packages/')


# A constant as_text() printed as `{...}`.
_ELIDED_CONSTANT = re.compile(r" constant\(\{\.\.\.\}\)")


def strip_metadata(text: str) -> str:
    return _FRAME_SECTIONS.sub("", _METADATA.sub("", text))


def entry_parameters(hlo_text: str) -> list[str]:
    """The ENTRY computation's parameter types (``f32[2,16]``), from its signature line."""
    signature = re.search(r"^ENTRY \S+ \((.*)\) -> ", hlo_text, re.M).group(1)
    return [f"{dtype}[{dims}]" for dtype, dims in re.findall(r":\s*(\w+)\[([\d,]*)\]", signature)]


_SCALAR = r'(?:"(?:[^"\\]|\\.)*"|-?[\d.eE+-]+|true|false|null)'
_SCALAR_LIST = re.compile(rf"\[\s*({_SCALAR}(?:,\s*{_SCALAR})*)\s*\]")


def manifest_json(manifest: dict) -> str:
    """Indented JSON, with lists of scalars (parameter types, shapes) kept on one line."""
    text = json.dumps(dict(sorted(manifest.items())), indent=1, sort_keys=True)
    return _SCALAR_LIST.sub(lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]",
                            text) + "\n"


def write_module(name: str, text: str) -> str:
    data = text.encode("utf-8")
    if len(data) <= COMPRESS_ABOVE:
        (OUT_DIR / name).write_bytes(data)
        return name
    (OUT_DIR / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return f"{name}.gz"


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
    state = (sds(task.trainable_variables), sds(task.non_trainable_variables),
             sds(task.optimizer.variables), sds(task.metrics_variables))
    data = (sds(x), sds(y), sds(sw))
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

    opt_state = jax.eval_shape(tx.init, params)
    return {"train": ("jax", train_step, (params, opt_state, inputs, labels, *extra)),
            "infer": ("jax", apply_infer, (params, inputs))}


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
    return {"train": ("jax", train_step, (params, jax.eval_shape(tx.init, params), tokens)),
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


def _hf_steps(loss_fn, forward, tx, params, batch):
    """``loss_fn(params, *batch)``; ``forward(params, *batch)``: train step with optax."""
    import jax
    import optax

    def train_step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return {"train": ("jax", train_step, (params, jax.eval_shape(tx.init, params), *batch)),
            "infer": ("jax", forward, (params, *batch))}


@register("transformers", "transformers", "gpt2", "jax (flax.linen)",
          "optax adamw(1e-3, weight_decay=0.01)",
          dict(model="FlaxGPT2LMHeadModel", vocab_size=VOCAB, n_positions=64, n_embd=32,
               n_layer=2, n_head=2, n_inner=64, dropout=0.0, batch=B, seq=S))
def transformers_gpt2():
    import jax
    import jax.numpy as jnp
    import optax

    model = _hf_model("FlaxGPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_positions=64,
                      n_embd=32, n_layer=2, n_head=2, n_inner=64, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0)
    params = _hf_params(model, (B, S))
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def forward(p, input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask, params=p, train=False).logits

    def loss_fn(p, input_ids, attention_mask):
        logits = model(input_ids, attention_mask=attention_mask, params=p, train=True,
                       dropout_rng=jax.random.PRNGKey(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], input_ids[:, 1:]).mean()
    return _hf_steps(loss_fn, forward, optax.adamw(1e-3, weight_decay=0.01), params, (ids, ids))


@register("transformers", "transformers", "llama", "jax (flax.linen)",
          "optax chain(clip_by_global_norm(1), adamw(1e-3))",
          dict(model="FlaxLlamaForCausalLM", vocab_size=VOCAB, hidden_size=32,
               intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, batch=B, seq=S,
               rope="sin/cos table from numpy (create_sinusoidal_positions)"))
def transformers_llama():
    import jax
    import jax.numpy as jnp
    import optax

    model = _hf_model("FlaxLlamaForCausalLM", "LlamaConfig", vocab_size=VOCAB, hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    params = _hf_params(model, (B, S))
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def forward(p, input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask, params=p, train=False).logits

    def loss_fn(p, input_ids, attention_mask):
        logits = model(input_ids, attention_mask=attention_mask, params=p, train=True,
                       dropout_rng=jax.random.PRNGKey(0)).logits
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], input_ids[:, 1:]).mean()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    return _hf_steps(loss_fn, forward, tx, params, (ids, ids))


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


# =========================================================================== one part (child)

def versions(part: str) -> dict:
    out = {}
    for dist in PARTS[part][0]:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _reason(err: BaseException) -> str:
    """The exception's first line (XLA's errors put the cause there, a stack after it)."""
    lines = str(err).strip().splitlines() or [""]
    return f"{type(err).__name__}: {lines[0][:400]}"


def _skipped(name: str, meta: dict, reason: str) -> dict:
    """Manifest entries for both variants of a capture that failed."""
    return {f"{name}{suffix}.hlo": dict(meta, elided=bool(suffix), skipped=reason)
            for suffix in ("", "_elided")}


def capture_module(name: str, meta: dict, kind: str, fn, args) -> dict:
    """Capture one (model, mode, target), write its file(s); returns their manifest entries."""
    target = meta["target"]
    started = time.perf_counter()
    try:
        elided_text, full_text = (jax_texts if kind == "jax" else tf_texts)(fn, args, target)
    except Exception as err:  # recorded: a missing file always has a stated reason
        traceback.print_exc()
        print(f"{name}: SKIPPED ({_reason(err)})", flush=True)
        return _skipped(name, meta, _reason(err))
    seconds = time.perf_counter() - started
    stripped = len(full_text.encode()) > COMPRESS_ABOVE
    if stripped:
        full_text, elided_text = strip_metadata(full_text), strip_metadata(elided_text)
    else:
        full_text = _SITE_PACKAGES.sub(r"\1", full_text)
        elided_text = _SITE_PACKAGES.sub(r"\1", elided_text)
    compile_call = ("jax.jit(fn).trace(*args).lower().compile()" if kind == "jax"
                    else "tf.function(jit_compile=True)")
    how = f"{compile_call} for {'XLA:CPU' if target == 'cpu' else 'deviceless XLA:GPU ' + target}"
    common = dict(meta, metadata_stripped=stripped, parameters=entry_parameters(full_text))
    full_name = write_module(f"{name}.hlo", full_text)
    entries = {full_name: dict(common, elided=False,
                               how=f"{how}, printed with large constants in full")}
    elided_meta = dict(common, elided=True,
                       how=f"{how}, as_text() (constants over XLA's print limit as {{...}})")
    has_elided = bool(_ELIDED_CONSTANT.search(elided_text))
    if has_elided:
        entries[write_module(f"{name}_elided.hlo", elided_text)] = elided_meta
    else:  # nothing elided: the same module
        entries[f"{name}_elided.hlo"] = dict(elided_meta, identical_to=full_name)
    print(f"{full_name}: {len(full_text)} chars, {seconds:.1f} s"
          f"{' (+ elided variant)' if has_elided else ''}", flush=True)
    return entries


def run_part(part: str, only: set[str] | None) -> dict:
    """Capture every model of one part; returns its manifest entries."""
    manifest = {}
    lib_versions = versions(part)
    for key, spec in MODELS.items():
        if spec["part"] != part or (only and spec["model"] not in only and key not in only):
            continue
        base = dict(model=spec["model"], library=spec["library"],
                    library_version=lib_versions.get(spec["library"].replace("_", "-")),
                    versions=lib_versions, framework=spec["framework"],
                    optimizer=spec["optimizer"], config=spec["config"], regenerate=REGENERATE)
        started = time.perf_counter()
        try:
            steps, build_error = spec["build"](), None
        except Exception as err:  # e.g. a library incompatible with this JAX
            traceback.print_exc()
            steps, build_error = {}, _reason(err)
        print(f"{key}: built in {time.perf_counter() - started:.1f} s", flush=True)
        for mode in spec["modes"]:
            for target in TARGETS:
                name, meta = f"{key}_{mode}_{target}", dict(base, mode=mode, target=target)
                if build_error or mode not in steps:
                    manifest.update(_skipped(name, meta, build_error or f"no {mode} step"))
                else:
                    manifest.update(capture_module(name, meta, *steps[mode]))
    return manifest


# =========================================================================== driver

def child_env(part: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONHASHSEED="0",
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX=r"^.*/(?:site|dist)-packages/")
    env.update(PARTS[part][1])
    return env


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", help="model names (e.g. gpt2 vit) or keys "
                        "(keras_hub_gpt2): capture just these, keep the other files")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("-j", "--jobs", type=int, default=1, help="parts run at once")
    opts = parser.parse_args(argv)
    only = set(opts.only) if opts.only else None

    if opts.part:  # a child: the environment is already set up by the parent
        from jax._src import source_info_util
        source_info_util.register_exclusion(__file__)
        Path(opts.result).write_text(json.dumps(run_part(opts.part, only)))
        return

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    manifest_path = OUT_DIR / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    selected = {key for key, spec in MODELS.items() if spec["part"] in opts.parts
                and (not only or spec["model"] in only or key in only)}

    def is_selected(entry):
        return f"{entry['library']}_{entry['model']}" in selected
    for name, entry in old.items():  # files of the models about to be recaptured go
        if is_selected(entry) and "skipped" not in entry and "identical_to" not in entry:
            (OUT_DIR / name).unlink(missing_ok=True)
    manifest = {name: entry for name, entry in old.items() if not is_selected(entry)}

    with tempfile.TemporaryDirectory() as tmp:
        running = []
        for part in opts.parts:
            if not any(MODELS[k]["part"] == part for k in selected):
                continue
            result = Path(tmp) / f"{part}.json"
            argv = [sys.executable, __file__, "--part", part, "--result", str(result)]
            if only:
                argv += ["--only", *only]
            while len(running) >= max(1, opts.jobs):
                _finish(running.pop(0), manifest)
            print(f"== {part}", flush=True)
            running.append((part, result, subprocess.Popen(argv, env=child_env(part),
                                                           cwd=REPO)))
        for job in running:
            _finish(job, manifest)

    manifest_path.write_text(manifest_json(manifest))
    files = [p for p in OUT_DIR.iterdir() if p.name.endswith((".hlo", ".hlo.gz"))]
    total = sum(p.stat().st_size for p in files)
    skipped = sorted({f"{e['library']}_{e['model']}_{e['mode']}_{e['target']}: {e['skipped']}"
                      for e in manifest.values() if "skipped" in e})
    print(f"{len(files)} HLO files, {total} bytes in {OUT_DIR}; {len(skipped)} skipped")
    for line in skipped:
        print(f"  skipped {line}")


def _finish(job, manifest: dict) -> None:
    part, result, proc = job
    if proc.wait() != 0 or not result.exists():
        raise SystemExit(f"part {part} failed (exit {proc.returncode}); see its output above")
    manifest.update(json.loads(result.read_text()))


if __name__ == "__main__":
    main()
