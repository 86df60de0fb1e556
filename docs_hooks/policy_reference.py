"""MkDocs hook: the policy reference, generated from the policy's JSON Schema at every build, so it never drifts.

A page that holds the line ``<!-- policy-reference -->`` gets, in its place, one
table per section of a policy file (``[data]``, ``[privacy.dp]``, ...): each
key, its type and allowed values, its default and its description, all read
from ``Policy.model_json_schema()``, the schema ``fedrecgel policy schema`` prints.
"""

from __future__ import annotations

import json

MARKER = "<!-- policy-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from fedrecgel_secure.policy import Policy

    return markdown.replace(MARKER, reference(Policy.model_json_schema()))


def reference(schema: dict) -> str:
    """Markdown: the top-level keys, then every section in file order, nested sections after their parent."""
    defs = schema.get("$defs", {})
    out: list[str] = []
    walk(schema, "", defs, out)
    return "\n".join(out)


def section_ref(prop: dict) -> str | None:
    """The model a property is a section of (``$ref``, or ``$ref`` or null for an optional section)."""
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    refs = [p["$ref"] for p in prop.get("anyOf", []) if "$ref" in p]
    return refs[0].rsplit("/", 1)[-1] if refs else None


def walk(model: dict, path: str, defs: dict, out: list[str], about: str = "") -> None:
    props = model.get("properties", {})
    keys = {k: p for k, p in props.items() if section_ref(p) is None}
    sections = {k: p for k, p in props.items() if section_ref(p) is not None}
    out += [f"### `[{path}]`" if path else "### Top level", ""]
    if about:
        out += [about, ""]
    if keys:
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for name, prop in keys.items():
            default = json.dumps(prop["default"], ensure_ascii=False) if "default" in prop else "required"
            about_key = cell(prop.get("description", ""))
            out.append(f"| `{name}` | {cell(type_of(prop))} | `{cell(default)}` | {about_key} |")
        out.append("")
    for name, prop in sections.items():
        about = prop.get("description", "") + (" Optional: absent unless given." if "anyOf" in prop else "")
        walk(defs[section_ref(prop)], f"{path}.{name}" if path else name, defs, out, about.strip())


def type_of(prop: dict) -> str:
    if "anyOf" in prop:
        return " or ".join(type_of(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array":
        kind = f"list of {type_of(prop.get('items', {}))}"
    elif kind == "object" and "additionalProperties" in prop:
        kind = f"table of {type_of(prop['additionalProperties'])}"
    bounds = [
        f"{sign} {prop[key]}"
        for key, sign in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
            ("minLength", "length ≥"),
            ("minItems", "items ≥"),
        )
        if key in prop
    ]
    if "pattern" in prop:
        bounds.append(f"matching `{prop['pattern']}`")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
