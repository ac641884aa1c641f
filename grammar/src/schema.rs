//! What a JSON Schema goes through before llguidance compiles it. Each step keeps every
//! document the constraint admits valid against the schema as the client gave it:
//!
//! - **Closed objects**: an object schema that names its `properties` and says nothing of
//!   others gets `"additionalProperties": false` (xgrammar's strict mode, SGLang's default
//!   backend, and OpenAI's strict schemas do the same), so a model writes the properties asked
//!   for instead of inventing keys until its tokens run out. Members of an `allOf` are left
//!   open (closing them would refuse each other's properties), as is a schema with
//!   `patternProperties` or `unevaluatedProperties`.
//! - **Unknown formats dropped**: a `format` llguidance does not know (`url`, `semver`, …) is
//!   an annotation to a JSON Schema validator (draft 2019-09 on; validators ignore formats they
//!   do not know, python's `jsonschema` among them), so it is left out rather than refused.
//! - **Disjoint `oneOf` as `anyOf`**: llguidance has no `oneOf`; when no document can match two
//!   of its branches (their `type`s do not overlap, or a property both require has disjoint
//!   `const`/`enum` values, or their own `const`/`enum` values are disjoint) "exactly one" is
//!   "at least one"; a property tells apart only branches of `"type": "object"`, since a
//!   string matches every branch that only says what an object must hold. Other `oneOf`s are
//!   still refused.

use serde_json::{Map, Value};

/// The formats llguidance 1.9 compiles (its `json/formats.rs`).
const KNOWN_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
    "unknown",
];

/// `schema` made ready for llguidance (see the module doc).
pub(crate) fn prepare(schema: &mut Value) {
    walk(schema, false);
}

/// Keywords whose value is a map of names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "$defs",
    "definitions",
    "patternProperties",
    "dependentSchemas",
];
/// Keywords whose value is not a schema.
const VALUES: &[&str] = &[
    "enum",
    "const",
    "default",
    "examples",
    "required",
    "x-guidance",
];

fn walk(schema: &mut Value, in_all_of: bool) {
    match schema {
        Value::Object(o) => {
            close(o, in_all_of);
            if o.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| !KNOWN_FORMATS.contains(&f))
            {
                o.remove("format");
            }
            one_of_as_any_of(o);
            for (key, sub) in o.iter_mut() {
                match (key.as_str(), sub) {
                    (k, Value::Object(by_name)) if SCHEMA_MAPS.contains(&k) => {
                        by_name.values_mut().for_each(|s| walk(s, false))
                    }
                    ("allOf", Value::Array(items)) => items.iter_mut().for_each(|s| walk(s, true)),
                    (k, _) if VALUES.contains(&k) => {}
                    (_, sub) => walk(sub, false),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|s| walk(s, false)),
        _ => {}
    }
}

fn close(o: &mut Map<String, Value>, in_all_of: bool) {
    let open = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ];
    if !in_all_of && o.contains_key("properties") && !open.iter().any(|k| o.contains_key(*k)) {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
}

fn one_of_as_any_of(o: &mut Map<String, Value>) {
    if o.contains_key("anyOf") {
        return;
    }
    let Some(Value::Array(branches)) = o.get("oneOf") else {
        return;
    };
    let disjoint = (0..branches.len())
        .all(|i| (i + 1..branches.len()).all(|j| never_both(&branches[i], &branches[j])));
    if disjoint {
        if let Some(branches) = o.remove("oneOf") {
            o.insert("anyOf".into(), branches);
        }
    }
}

/// The JSON types a schema's `type` allows, `integer` within `number`; `None`: any.
fn types(s: &Value) -> Option<Vec<&str>> {
    let t = s.get("type")?;
    let list: Vec<&str> = match t {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    Some(list)
}

/// The values a schema's `const` or `enum` allows; `None`: not limited so.
fn values(s: &Value) -> Option<Vec<&Value>> {
    if let Some(c) = s.get("const") {
        return Some(vec![c]);
    }
    s.get("enum")?.as_array().map(|e| e.iter().collect())
}

fn disjoint_values(a: &Value, b: &Value) -> bool {
    match (values(a), values(b)) {
        (Some(x), Some(y)) => x.iter().all(|v| !y.contains(v)),
        _ => false,
    }
}

/// No document matches both `a` and `b` (by the rules of the module doc).
fn never_both(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (types(a), types(b)) {
        let overlap = |p: &str, q: &str| {
            p == q || matches!((p, q), ("integer", "number") | ("number", "integer"))
        };
        if x.iter().all(|p| y.iter().all(|q| !overlap(p, q))) {
            return true;
        }
    }
    if disjoint_values(a, b) {
        return true;
    }
    // `properties` and `required` say nothing of what is not an object: only two branches
    // that admit objects alone are told apart by a property.
    let objects_only = |s: &Value| types(s).is_some_and(|t| t == ["object"]);
    if !(objects_only(a) && objects_only(b)) {
        return false;
    }
    let required = |s: &Value, p: &str| {
        s.get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|n| n == p))
    };
    let (Some(pa), Some(pb)) = (
        a.get("properties").and_then(Value::as_object),
        b.get("properties").and_then(Value::as_object),
    ) else {
        return false;
    };
    pa.iter().any(|(name, sa)| {
        pb.get(name)
            .is_some_and(|sb| required(a, name) && required(b, name) && disjoint_values(sa, sb))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prepared(mut v: Value) -> Value {
        prepare(&mut v);
        v
    }

    #[test]
    fn objects_that_name_their_properties_admit_no_others_unless_they_say_so() {
        let schema = prepared(json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "b": {"type": "object", "properties": {"y": {}}, "additionalProperties": true},
                "c": {"allOf": [{"properties": {"p": {}}}, {"properties": {"q": {}}}]},
                "properties": {"type": "object", "properties": {"z": {}}}
            },
            "$defs": {"d": {"properties": {"w": {}}}},
            "enum": [{"properties": {}}]
        }));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["b"]["additionalProperties"], true);
        assert!(schema["properties"]["c"]["allOf"][0]
            .get("additionalProperties")
            .is_none());
        assert_eq!(
            schema["properties"]["properties"]["additionalProperties"],
            false
        );
        assert!(
            schema["properties"].get("additionalProperties").is_none(),
            "a map of schemas"
        );
        assert_eq!(schema["$defs"]["d"]["additionalProperties"], false);
        assert!(
            schema["enum"][0].get("additionalProperties").is_none(),
            "a value, not a schema"
        );
    }

    #[test]
    fn formats_llguidance_does_not_know_are_annotations_left_out() {
        let s = prepared(json!({"type": "object", "properties": {
            "a": {"type": "string", "format": "url"},
            "b": {"type": "string", "format": "date-time"},
            "c": {"type": "string", "format": "semver"}}}));
        assert!(s["properties"]["a"].get("format").is_none());
        assert_eq!(s["properties"]["b"]["format"], "date-time");
        assert!(s["properties"]["c"].get("format").is_none());
    }

    #[test]
    fn a_one_of_whose_branches_never_overlap_is_an_any_of() {
        let kinds = prepared(json!({"oneOf": [{"type": "string"}, {"type": ["integer", "null"]}]}));
        assert!(kinds.get("oneOf").is_none() && kinds["anyOf"].is_array());
        let tagged = prepared(json!({"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "x": {}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}}, "required": ["kind"]}]}));
        assert!(tagged["anyOf"].is_array());
        let consts = prepared(json!({"oneOf": [{"const": 1}, {"enum": [2, 3]}]}));
        assert!(consts["anyOf"].is_array());
        // Could match both: left as oneOf (llguidance then refuses it).
        for overlapping in [
            json!({"oneOf": [{"type": "number"}, {"type": "integer"}]}),
            json!({"oneOf": [{"type": "string"}, {"maxLength": 3}]}),
            json!({"oneOf": [{"properties": {"k": {"const": "a"}}}, {"properties": {"k": {"const": "b"}}}]}),
            json!({"oneOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}),
            // No type: a string is valid under both (JSONSchemaBench's o51159).
            json!({"oneOf": [
                {"properties": {"provider": {"enum": ["mastercard"]}}, "required": ["provider"]},
                {"properties": {"provider": {"enum": ["visa"]}}, "required": ["provider"]}]}),
        ] {
            let p = prepared(overlapping.clone());
            assert!(p.get("oneOf").is_some(), "{overlapping}");
        }
    }
}
