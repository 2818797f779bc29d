"""The episodes of RL Unplugged's Atari shards: one ``tf.train.Example`` per episode.

The schema is TensorFlow's public ``example.proto`` and ``feature.proto`` (package
``tensorflow``). The message classes are built here from a descriptor written in
Python with the same field numbers, so the protobuf library parses them without
TensorFlow, generated code or ``protoc``.

An Example holds these features (TFDS's ``atari_utils.atari_example_to_rlds`` is
the reference for their meaning):

============================  ==========  =========================================
feature                       kind        per
============================  ==========  =========================================
``checkpoint_idx``            int64       episode (the shard's index)
``episode_idx``               int64       episode
``episode_return``            float       episode (optional here)
``clipped_episode_return``    float       episode (absent in newer releases)
``observations``              bytes list  step: one PNG, 84x84x1 uint8
``actions``                   int64 list  step
``unclipped_rewards``         float list  step
``clipped_rewards``           float list  step (absent in newer releases)
``discounts``                 float list  step
============================  ==========  =========================================

If ``discounts[-1] == 0`` the episode ended in a terminal state and its last step
carries only the terminal observation: its action and reward are not real.
Otherwise every step is real and the episode was cut.

Examples
--------
>>> import numpy as np
>>> episode = Episode(
...     checkpoint_idx=3, episode_idx=7, episode_return=2.0, clipped_episode_return=1.0,
...     observations=[b"png0", b"png1", b"png2"], actions=np.array([1, 2, 0]),
...     unclipped_rewards=np.array([0.0, 2.0, 0.0]), clipped_rewards=np.array([0.0, 1.0, 0.0]),
...     discounts=np.array([1.0, 1.0, 0.0]))
>>> parsed = parse_episode(encode_episode(episode), "run_1-00003-of-00050", 0)
>>> parsed.checkpoint_idx, parsed.steps, parsed.terminal, parsed.real_steps
(3, 3, True, 2)
>>> parsed.actions.tolist(), parsed.unclipped_rewards.dtype.name
([1, 2, 0], 'float32')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from atari_zarr.errors import SourceFormatError, damaged_advice

__all__ = [
    "EPISODE_FEATURES",
    "OPTIONAL_FEATURES",
    "REQUIRED_FEATURES",
    "STEP_FEATURES",
    "Episode",
    "encode_episode",
    "example_class",
    "parse_episode",
]

#: Features every Example must have, with the kind of list each one is.
REQUIRED_FEATURES = {
    "checkpoint_idx": "int64_list",
    "episode_idx": "int64_list",
    "observations": "bytes_list",
    "actions": "int64_list",
    "unclipped_rewards": "float_list",
    "discounts": "float_list",
}
#: Features an Example may lack (newer releases dropped the clipped ones as redundant).
OPTIONAL_FEATURES = {
    "episode_return": "float_list",
    "clipped_episode_return": "float_list",
    "clipped_rewards": "float_list",
}
#: Features with one value per episode.
EPISODE_FEATURES = ("checkpoint_idx", "episode_idx", "episode_return", "clipped_episode_return")
#: Features with one value per step, all of the same length.
STEP_FEATURES = ("observations", "actions", "unclipped_rewards", "clipped_rewards", "discounts")

_PROTO_FILE = "atari_zarr/tensorflow_example.proto"
_LABEL_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_LABEL_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_TYPE = descriptor_pb2.FieldDescriptorProto


def _field(
    name: str, number: int, ftype: int, *, repeated: bool = False, type_name: str = ""
) -> descriptor_pb2.FieldDescriptorProto:
    spec = descriptor_pb2.FieldDescriptorProto(
        name=name,
        number=number,
        type=ftype,  # type: ignore[arg-type]
        label=_LABEL_REPEATED if repeated else _LABEL_OPTIONAL,
    )
    if type_name:
        spec.type_name = type_name
    return spec


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """``tensorflow/core/example/{feature,example}.proto``, the messages Examples need."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=_PROTO_FILE, package="tensorflow", syntax="proto3"
    )
    for name, ftype in (
        ("BytesList", _TYPE.TYPE_BYTES),
        ("FloatList", _TYPE.TYPE_FLOAT),
        ("Int64List", _TYPE.TYPE_INT64),
    ):
        msg = proto.message_type.add(name=name)
        msg.field.append(_field("value", 1, ftype, repeated=True))  # packed: proto3 default
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for name, number, type_name in (
        ("bytes_list", 1, ".tensorflow.BytesList"),
        ("float_list", 2, ".tensorflow.FloatList"),
        ("int64_list", 3, ".tensorflow.Int64List"),
    ):
        spec = _field(name, number, _TYPE.TYPE_MESSAGE, type_name=type_name)
        spec.oneof_index = 0
        feature.field.append(spec)
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.append(_field("key", 1, _TYPE.TYPE_STRING))
    entry.field.append(_field("value", 2, _TYPE.TYPE_MESSAGE, type_name=".tensorflow.Feature"))
    features.field.append(
        _field(
            "feature",
            1,
            _TYPE.TYPE_MESSAGE,
            repeated=True,
            type_name=".tensorflow.Features.FeatureEntry",
        )
    )
    example = proto.message_type.add(name="Example")
    example.field.append(
        _field("features", 1, _TYPE.TYPE_MESSAGE, type_name=".tensorflow.Features")
    )
    return proto


def _build_classes() -> dict[str, Any]:
    # a private pool: a process that also imports TensorFlow has its own
    # tensorflow.Example in the default pool, and the two must not clash
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{name}"))
        for name in ("BytesList", "FloatList", "Int64List", "Feature", "Features", "Example")
    }


_CLASSES = _build_classes()
_Example = _CLASSES["Example"]


def example_class(name: str = "Example") -> Any:
    """The protobuf message class ``tensorflow.<name>`` (Example, Features, Feature, ...).

    Examples
    --------
    >>> ex = example_class()()
    >>> ex.features.feature["actions"].int64_list.value.extend([0, 3])
    >>> example_class().FromString(ex.SerializeToString()).features.feature["actions"]
    int64_list {
      value: 0
      value: 3
    }
    <BLANKLINE>
    """
    return _CLASSES[name]


@dataclass
class Episode:
    """One Example of a shard: an episode as the file holds it (terminal step included).

    ``observations`` holds one PNG per step (empty when parsed without them).
    """

    checkpoint_idx: int
    episode_idx: int
    episode_return: float | None
    clipped_episode_return: float | None
    observations: list[bytes]
    actions: np.ndarray
    unclipped_rewards: np.ndarray
    clipped_rewards: np.ndarray | None
    discounts: np.ndarray

    @property
    def steps(self) -> int:
        """Steps of the Example, the terminal step included."""
        return len(self.actions)

    @property
    def terminal(self) -> bool:
        """The episode ended in a terminal state (``discounts[-1] == 0``)."""
        return bool(len(self.discounts)) and float(self.discounts[-1]) == 0.0

    @property
    def real_steps(self) -> int:
        """Steps whose action and reward are real: all of them unless the episode is terminal."""
        return self.steps - 1 if self.terminal else self.steps


def _fail(where: str, record: int, what: str) -> SourceFormatError:
    return SourceFormatError(
        f"{where}: record {record}: {what}; expected a tf.train.Example of an RL Unplugged "
        f"Atari episode, or the shard is not from RL Unplugged's atari_episodes_ordered. "
        f"{damaged_advice(where)}"
    )


def _values(feature_map: Any, name: str, kind: str, where: str, record: int) -> Any:
    """The ``value`` list of feature ``name``, which must be a list of ``kind``."""
    feature = feature_map[name]
    found = feature.WhichOneof("kind")
    if found != kind:
        what = f"is {found}" if found else "has no list"
        raise _fail(where, record, f"feature {name!r} {what}, expected {kind}")
    return getattr(feature, kind).value


def _scalar(feature_map: Any, name: str, kind: str, where: str, record: int) -> Any:
    values = _values(feature_map, name, kind, where, record)
    if len(values) != 1:
        raise _fail(where, record, f"feature {name!r} has {len(values)} values, not 1")
    return values[0]


def parse_episode(data: bytes, where: str, record: int, *, observations: bool = True) -> Episode:
    """Parse one serialized ``tf.train.Example`` into an :class:`Episode`.

    Parameters
    ----------
    data : bytes
        The record's data (:func:`~atari_zarr.sources.rl_unplugged.tfrecord.iter_records`).
    where : str
        The shard's path or URL, for messages.
    record : int
        The record's index in the shard, for messages.
    observations : bool
        Keep the PNGs (``False`` leaves ``observations`` empty; the step count is
        still checked against them).

    Raises
    ------
    SourceFormatError
        Naming ``where`` and ``record``: not an Example; a required feature missing;
        a feature of the wrong kind, or a per-episode feature without exactly one
        value; per-step lists of different lengths; an episode without steps.

    Examples
    --------
    >>> parse_episode(b"not a protobuf", "run_1-00000-of-00050", 4)
    Traceback (most recent call last):
        ...
    atari_zarr.errors.SourceFormatError: run_1-00000-of-00050: record 4: not a protobuf message...
    """
    try:
        example = _Example.FromString(data)
    except message.DecodeError as exc:
        raise _fail(where, record, f"not a protobuf message ({exc})") from None
    feature_map = example.features.feature
    missing = [name for name in REQUIRED_FEATURES if name not in feature_map]
    if missing:
        present = ", ".join(sorted(feature_map)) or "none"
        raise _fail(
            where,
            record,
            f"feature(s) {', '.join(missing)} missing (features present: {present})",
        )
    optional = {name: kind for name, kind in OPTIONAL_FEATURES.items() if name in feature_map}
    checkpoint_idx = int(_scalar(feature_map, "checkpoint_idx", "int64_list", where, record))
    episode_idx = int(_scalar(feature_map, "episode_idx", "int64_list", where, record))
    returns: dict[str, float | None] = {}
    for name in ("episode_return", "clipped_episode_return"):
        returns[name] = (
            float(_scalar(feature_map, name, optional[name], where, record))
            if name in optional
            else None
        )
    pngs = _values(feature_map, "observations", "bytes_list", where, record)
    lists: dict[str, np.ndarray] = {
        "actions": np.array(
            _values(feature_map, "actions", "int64_list", where, record), dtype=np.int64
        ),
        "unclipped_rewards": np.array(
            _values(feature_map, "unclipped_rewards", "float_list", where, record),
            dtype=np.float32,
        ),
        "discounts": np.array(
            _values(feature_map, "discounts", "float_list", where, record), dtype=np.float32
        ),
    }
    clipped = None
    if "clipped_rewards" in optional:
        clipped = np.array(
            _values(feature_map, "clipped_rewards", "float_list", where, record),
            dtype=np.float32,
        )
        lists["clipped_rewards"] = clipped
    lengths = {"observations": len(pngs), **{name: len(v) for name, v in lists.items()}}
    if len(set(lengths.values())) != 1:
        spelled = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise _fail(where, record, f"the per-step lists differ in length ({spelled})")
    steps = lengths["observations"]
    if steps == 0:
        raise _fail(where, record, "the episode has no steps")
    return Episode(
        checkpoint_idx=checkpoint_idx,
        episode_idx=episode_idx,
        episode_return=returns["episode_return"],
        clipped_episode_return=returns["clipped_episode_return"],
        observations=list(pngs) if observations else [],
        actions=lists["actions"],
        unclipped_rewards=lists["unclipped_rewards"],
        clipped_rewards=clipped,
        discounts=lists["discounts"],
    )


def encode_episode(episode: Episode) -> bytes:
    """Serialize ``episode`` as a ``tf.train.Example``; ``None`` fields are left out.

    Examples
    --------
    >>> import numpy as np
    >>> ep = Episode(0, 1, None, None, [b"png"], np.array([2]), np.array([0.5]), None,
    ...              np.array([1.0]))
    >>> data = encode_episode(ep)
    >>> sorted(example_class().FromString(data).features.feature)
    ['actions', 'checkpoint_idx', 'discounts', 'episode_idx', 'observations', 'unclipped_rewards']
    """
    example = _Example()
    feature = example.features.feature
    feature["checkpoint_idx"].int64_list.value.append(int(episode.checkpoint_idx))
    feature["episode_idx"].int64_list.value.append(int(episode.episode_idx))
    if episode.episode_return is not None:
        feature["episode_return"].float_list.value.append(float(episode.episode_return))
    if episode.clipped_episode_return is not None:
        feature["clipped_episode_return"].float_list.value.append(
            float(episode.clipped_episode_return)
        )
    feature["observations"].bytes_list.value.extend(episode.observations)
    feature["actions"].int64_list.value.extend(np.asarray(episode.actions).tolist())
    feature["unclipped_rewards"].float_list.value.extend(
        np.asarray(episode.unclipped_rewards, dtype=np.float32).tolist()
    )
    if episode.clipped_rewards is not None:
        feature["clipped_rewards"].float_list.value.extend(
            np.asarray(episode.clipped_rewards, dtype=np.float32).tolist()
        )
    feature["discounts"].float_list.value.extend(
        np.asarray(episode.discounts, dtype=np.float32).tolist()
    )
    return bytes(example.SerializeToString(deterministic=True))
