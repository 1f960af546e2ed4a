"""The one cache configuration: policy + options, cache size, miss split, prefill chunk, profile / future sources.

Engine, simulator, every `ft` command, the server and the Hydra experiments build this record by field name and
validate it here, once. Errors name the field in the vocabulary of the entry point that built the record (`--fraction`
on a command line, `cache.fraction` under Hydra, `fraction` in Python): `cache_config(names, **fields)`.

Size rule (everywhere): exactly one of `capacity` (expert slots, 0..all) or `fraction` (of all (layer, expert)
pairs, in (0, 1]; no cache at all is `capacity=0`). The policy's profile / future come from its options (already
built: counts, a KeyStream) or from a trace file (`profile`, `future`); a simulator falls back to the replayed trace.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Mapping

from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.split import Split

from freetoken.defaults import DEFAULT_PREFILL_CHUNK, MAX_PREFILL_CHUNK  # noqa: E402  (one value, read without imports by the CLI)
# options built from data (a trace, the live router; past: moe_infinity's library of activation matrices; carry:
# keys carried across speculative steps), not typed in
SOURCE_OPTIONS = ("profile", "future", "hint", "past", "carry")


class ConfigError(ValueError):
    """A bad field; render(names) words it in an entry point's vocabulary ({"fraction": "--fraction", ...})."""

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] | None = None) -> str:
        return self.template.format_map(_Words(names or {}, self.values))


class _Words(dict):
    """Template values; a field name not in them is worded by the entry point's names, else left as it is."""

    def __init__(self, names: Mapping[str, str], values: dict):
        super().__init__(values)
        self.names = names

    def __missing__(self, key: str) -> str:
        return self.names.get(key, key)


def policy_class(name: str) -> type[PlacementPolicy]:
    from freetoken.placement import POLICIES

    if name not in POLICIES:
        raise ConfigError("{policy}: unknown {name!r}; valid: {valid}", name=name, valid=", ".join(sorted(POLICIES)))
    return POLICIES[name]


def policy_option_names(name: str) -> set[str]:
    """Keyword options of the policy's constructor (profile / future / hint among them where it reads them)."""
    return set(constructor_options(policy_class(name)))


@functools.lru_cache(maxsize=None)
def constructor_options(cls: type) -> frozenset[str]:
    """The keyword options a policy class's constructor takes (read once per class)."""
    return frozenset(inspect.signature(cls.__init__).parameters) - {"self", "capacity", "num_layers", "num_experts"}


# a typed option's annotation -> (check, how the error words it); other annotations (unions, arrays) are the
# policy's own to check
OPTION_KINDS = {
    "int": (lambda v: _whole(v), "a whole number"),
    "float": (lambda v: _number(v), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
}


@functools.lru_cache(maxsize=None)
def option_kinds(cls: type) -> dict[str, str]:
    """option -> its constructor annotation when that is one of OPTION_KINDS ("float", ...)."""
    out = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        kind = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        if kind in OPTION_KINDS:
            out[name] = kind
    return out


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """policy: a key of POLICIES; options: its constructor's keyword arguments (None values: its defaults).
    profile / future: trace files whose counts pin experts (frequency) / whose calls are the future (belady & co.).
    staging: the engine's rows for fetched, unkept experts (None: one layer's experts)."""

    policy: str = "lru"
    split: Split = field(default_factory=Split)
    capacity: int | None = None
    fraction: float | None = None
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    options: dict = field(default_factory=dict)
    profile: str | None = None
    future: str | None = None
    staging: int | None = None

    def __post_init__(self) -> None:
        cls = policy_class(self.policy)
        if not isinstance(self.split, Split):
            raise ConfigError("{split}: expected a Split, got {got}", got=type(self.split).__name__)
        self.split.check_used()
        if (self.capacity is None) == (self.fraction is None):
            raise ConfigError("give exactly one of {fraction} or {capacity}")
        if self.capacity is not None and not (_whole(self.capacity) and self.capacity >= 0):
            raise ConfigError("{capacity} must be a whole number of expert slots >= 0, got {v}", v=self.capacity)
        if self.fraction is not None and not (_number(self.fraction) and 0 < self.fraction <= 1):
            tail = " (no cache at all: {capacity} 0)" if self.fraction == 0 else ""
            raise ConfigError("{fraction} must lie in (0, 1], got {v}" + tail, v=self.fraction)
        if not (_whole(self.prefill_chunk) and 0 < self.prefill_chunk <= MAX_PREFILL_CHUNK):
            raise ConfigError("{prefill_chunk} must be a positive number of tokens, at most {m}, got {v}",
                              m=MAX_PREFILL_CHUNK, v=self.prefill_chunk)
        if self.staging is not None and not (_whole(self.staging) and self.staging >= 0):
            raise ConfigError("{staging} must be >= 0, got {v}", v=self.staging)
        accepted = policy_option_names(self.policy)
        unknown = set(self.options) - accepted
        if unknown:
            typed = sorted(accepted - set(SOURCE_OPTIONS))
            raise ConfigError("{options}: {name} takes no option {bad}; it takes: {ok}", name=self.policy,
                              bad=", ".join(sorted(unknown)), ok=", ".join(typed) or "none")
        kinds = option_kinds(cls)
        for key, value in sorted(self.options.items()):
            ok, words = OPTION_KINDS.get(kinds.get(key), (None, None))
            if value is not None and ok is not None and not ok(value):
                raise ConfigError("{options}: {name} option {key} must be {words}, got {v!r}", name=self.policy,
                                  key=key, words=words, v=value)
        if self.profile is not None and not {"profile", "past"} & accepted:
            raise ConfigError("{profile}: only a policy with a profile (frequency, ktransformers_dynamic, lru, "
                              "moe_infinity) reads one, not {name}", name=self.policy)
        if self.future is not None and not cls.needs_future:
            raise ConfigError("{future}: {name} does not read the future", name=self.policy)

    def slots_for(self, num_layers: int, num_experts: int) -> int:
        """Expert slots of the policy for a model (or trace) of num_layers MoE layers x num_experts."""
        n = num_layers * num_experts
        if self.capacity is not None:
            if self.capacity > n:
                raise ConfigError("{capacity} {c} exceeds the model's {n} routed experts ({L} MoE layers x {E})",
                                  c=self.capacity, n=n, L=num_layers, E=num_experts)
            return self.capacity
        return int(round(self.fraction * n))

    def constructor_options(self) -> dict:
        return {k: v for k, v in self.options.items() if v is not None}


def cache_config(names: Mapping[str, str] | None = None, /, config_class: type = CacheConfig, **values) -> CacheConfig:
    """config_class(**values) (CacheConfig or a subclass), its error worded with `names` (field -> how the entry
    point spells it)."""
    try:
        return config_class(**values)
    except ConfigError as e:
        raise ValueError(e.render(names)) from None


def build_policy(config: CacheConfig, num_layers: int, num_experts: int, *, profile=None,
                 future=None, library=None) -> PlacementPolicy:
    """The policy of `config` for num_layers x num_experts MoE layers x experts, sources filled in (policy_options).
    Errors are ConfigErrors: the entry point words them (`ft` with its flags, the experiments with their keys)."""
    options = policy_options(config, profile=profile, future=future, library=library)
    if options.get("n_cpu_layers") == "all":  # llama.cpp --cpu-moe: every MoE layer's experts on the CPU
        options["n_cpu_layers"] = num_layers
    capacity = config.slots_for(num_layers, num_experts)
    policy_class(config.policy)  # an unknown name is a ConfigError, worded by the entry point
    from freetoken.placement import make_policy

    return make_policy(config.policy, capacity, num_layers, num_experts, **options)  # compiled where built in


def policy_options(config: CacheConfig, *, profile=None, future=None, library=None) -> dict:
    """The constructor options with the policy's sources, taken in this order: options already built > the config's
    trace files > the fallbacks given here (profile: a RoutingTrace whose counts pin; future: a KeyStream; in a
    simulator both the replayed trace; library: a RoutingTrace whose requests' activation matrices seed
    moe_infinity, never the replayed one). A required source still missing is a ConfigError naming the field; an
    optional profile (the policy's needs_profile(options) is false: lru's split=equal, ktransformers_dynamic's uniform
    start, frequency's uniform / front_loading) is left out."""
    from freetoken.trace import load
    from freetoken.trace.stats import expert_counts

    cls = policy_class(config.policy)
    options = config.constructor_options()
    if "profile" in policy_option_names(config.policy) and "profile" not in options:
        needs = getattr(cls, "needs_profile", None)  # (options) -> bool, where only some options read it
        optional = needs is not None and not needs(options)  # then the fallback is not counted (memory, time)
        trace = load(config.profile) if config.profile is not None else None if optional else profile
        if trace is None and optional:
            pass
        elif trace is None:
            raise ConfigError("{policy} {name} needs {profile} (a trace whose counts pick the pinned experts)",
                              name=config.policy)
        else:
            options["profile"] = expert_counts(trace)
    if "past" in policy_option_names(config.policy) and "past" not in options:
        trace = load(config.profile) if config.profile is not None else library
        if trace is not None:
            from freetoken.placement.policies.moe_infinity import activation_matrices

            options["past"] = activation_matrices(trace)
    if cls.needs_future and "future" not in options and "hint" not in options:
        if future is None:
            raise ConfigError("{policy} {name} needs {future} (a trace recorded on the same input)",
                              name=config.policy)
        options["future"] = future
    return options


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
