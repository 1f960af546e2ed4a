"""A JSON schema checked before its request joins a batch: valid JSON Schema (2020-12), only keywords the grammar
really enforces (xgrammar 0.2.8, measured by random walks through its grammars against jsonschema: it treats
oneOf as anyOf, allOf of several, not, if/then/else, uniqueItems, contains and dependentRequired not at all), local
$refs only, and at least one finite instance (a $ref cycle every branch of which requires itself has none: the
grammar would never let the output end). Each problem is a ValueError naming the schema path."""

from __future__ import annotations

from typing import Iterator

# keywords the grammar cannot enforce: a reply could break them, so the schema is refused
UNENFORCED = {
    "oneOf": "use anyOf: a grammar cannot make branches exclusive",
    "not": "a grammar cannot exclude a sub-schema",
    "if": "conditional schemas are not enforced", "then": "conditional schemas are not enforced",
    "else": "conditional schemas are not enforced",
    "uniqueItems": "a grammar cannot compare array items",
    "contains": "not enforced", "minContains": "not enforced", "maxContains": "not enforced",
    "dependentRequired": "not enforced", "dependentSchemas": "not enforced", "dependencies": "not enforced",
    "unevaluatedProperties": "not enforced (use additionalProperties)", "unevaluatedItems": "not enforced",
    "$dynamicRef": "not resolved", "$recursiveRef": "not resolved",
}
# where sub-schemas sit: keyword -> "one" | "list" | "map"
CHILDREN = {"items": "one", "additionalProperties": "one", "propertyNames": "one", "not": "one",
            "prefixItems": "list", "anyOf": "list", "allOf": "list", "oneOf": "list",
            "properties": "map", "patternProperties": "map", "$defs": "map", "definitions": "map"}


def subschemas(schema, path: str) -> Iterator[tuple[object, str]]:
    """(sub-schema, its path) of every schema nested in this one, this one first."""
    stack = [(schema, path)]
    while stack:
        node, where = stack.pop()
        yield node, where
        if not isinstance(node, dict):
            continue
        for key, kind in CHILDREN.items():
            child = node.get(key)
            if kind == "one" and isinstance(child, (dict, bool)):
                stack.append((child, f"{where}.{key}"))
            elif kind == "list" and isinstance(child, list):
                stack.extend((c, f"{where}.{key}[{i}]") for i, c in enumerate(child))
            elif kind == "map" and isinstance(child, dict):
                stack.extend((c, f"{where}.{key}.{name}") for name, c in child.items())


def resolve(root: dict, ref: str, where: str):
    """A local $ref (#, #/a/b) into the root schema."""
    if not ref.startswith("#"):
        raise ValueError(f"{where}.$ref: only references into this schema (#/...) are supported, got {ref!r}")
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"{where}.$ref: {ref!r} points at nothing in this schema")
    return node


def has_instance(root: dict, param: str) -> None:
    """Fixed point over $ref targets: a schema has a finite instance unless every way to satisfy it goes through a
    $ref that (so far) has none."""
    refs: dict[str, bool] = {}

    def finite(node) -> bool:
        if node is False:
            return False
        if not isinstance(node, dict):
            return True
        if "$ref" in node and not refs.get(node["$ref"], False):
            return False
        if "allOf" in node and not all(finite(s) for s in node["allOf"]):
            return False
        if "anyOf" in node and not any(finite(s) for s in node["anyOf"]):
            return False
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else (kinds or ["object", "array", "string", "number"])
        for kind in kinds:
            if kind == "object" and all(finite((node.get("properties") or {}).get(name, True))
                                        for name in node.get("required", [])):
                return True
            if kind == "array":
                need = node.get("minItems", 0)
                prefix = node.get("prefixItems") or []
                if all(finite(s) for s in prefix[:need]) and (need <= len(prefix) or finite(node.get("items", True))):
                    return True
            if kind not in ("object", "array"):
                return True
        return False

    found = [(n["$ref"], w) for n, w in subschemas(root, param) if isinstance(n, dict) and "$ref" in n]
    changed = True
    while changed:
        changed = False
        for ref, where in found:
            if not refs.get(ref) and finite(resolve(root, ref, where)):
                refs[ref] = changed = True
    if not finite(root):
        stuck = max((w for ref, w in found if not refs.get(ref)), key=len, default=param)  # the cycle's own $ref
        raise ValueError(f"{stuck}: the schema has no finite instance (a $ref cycle that every branch requires): "
                         f"the output could never end")


def check_schema(schema, param: str) -> None:
    from jsonschema import Draft202012Validator, SchemaError

    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{param}: a JSON schema is an object, got {type(schema).__name__}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
        raise ValueError(f"{param}{where}: not a valid JSON schema: {e.message}") from None
    if not isinstance(schema, dict):
        return
    for node, where in subschemas(schema, param):
        if not isinstance(node, dict):
            continue
        for key in node:
            if key in UNENFORCED:
                raise ValueError(f"{where}.{key}: not supported in structured output ({UNENFORCED[key]})")
        if len(node.get("allOf") or []) > 1:
            raise ValueError(f"{where}.allOf: only one sub-schema is supported (merge them into one)")
        if "$ref" in node:
            resolve(schema, node["$ref"], where)
    has_instance(schema, param)
