//! The configuration's value tree, generic over the section types: a file parsed into one
//! JSON-like tree, overrides set at key paths, and each section typed with every bad key
//! reported. Kept apart from the section types so that it is fuzzed on its own
//! (`fuzz/fuzz_targets/config.rs`) with the sections it can build, and read by every file
//! the collector takes (the configuration, a budget table).

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A configuration file's syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

/// Parse a configuration file's text into the value tree; an empty document is an empty
/// configuration. The error says what is wrong and where, without the file's name.
pub fn parse(text: &str, format: Format) -> Result<Value, String> {
    let value: Value = match format {
        Format::Yaml => serde_saphyr::from_str_with_options(text, yaml_options(text))
            .map_err(|e| format!("is not valid YAML: {e}"))?,
        Format::Toml => toml::from_str(text).map_err(|e| format!("is not valid TOML: {e}"))?,
    };
    Ok(if value.is_null() {
        Value::Object(Map::new())
    } else {
        value
    })
}

/// The parser's limits for `text`: its node and event counts scale with the text (a node
/// takes at least two bytes without aliases, whose expansion keeps its own limits), so that
/// a budget table at width (one entry per edge: 178,000 edges are 650,000 nodes) reads,
/// while the alias limits still stop an expansion bomb.
fn yaml_options(text: &str) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = budget.max_nodes.max(text.len());
    budget.max_events = budget.max_events.max(text.len().saturating_mul(2));
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Type one section. On an error at some key, record it (with the value found there),
/// remove that key so its default applies, and try again: every bad key of the section is
/// reported, not only the first one serde meets.
pub fn section<T: DeserializeOwned + Default>(
    sections: &mut Map<String, Value>,
    name: &str,
    errors: &mut Vec<(String, String)>,
) -> T {
    // A missing section, or one whose keys are all commented out (YAML reads `links:` alone
    // as null), is the defaults.
    let Some(mut value) = sections.remove(name).filter(|v| !v.is_null()) else {
        return T::default();
    };
    loop {
        let error = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(typed) => return typed,
            Err(e) => e,
        };
        let segments: Vec<String> = error
            .path()
            .iter()
            .map(|segment| segment.to_string())
            .filter(|segment| segment != ".")
            .collect();
        let key = std::iter::once(name.to_owned())
            .chain(segments.iter().cloned())
            .collect::<Vec<_>>()
            .join(".");
        let found = lookup(&value, &segments)
            .filter(|v| !v.is_object() && !v.is_array())
            .map(|v| format!(" (found {v})"))
            .unwrap_or_default();
        errors.push((key, format!("{}{found}", error.into_inner())));
        if segments.is_empty() || !remove(&mut value, &segments) {
            return T::default();
        }
    }
}

fn lookup<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, key| node.get(key))
}

/// Remove the key at `path`; false when there was nothing to remove.
fn remove(value: &mut Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let parent = parents
        .iter()
        .try_fold(value, |node, key| node.get_mut(key));
    match parent {
        Some(Value::Object(map)) => map.remove(last).is_some(),
        _ => false,
    }
}

/// Set `keys` in `tree`, creating mappings on the way (a scalar in the way is replaced).
pub fn set(tree: &mut Value, keys: &[String], value: Value) {
    let Some((last, parents)) = keys.split_last() else {
        return;
    };
    let mut node = tree;
    for key in parents {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else {
            unreachable!("just made an object")
        };
        node = map
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    if let Value::Object(map) = node {
        map.insert(last.clone(), value);
    }
}

/// An environment value as the scalar it spells: integer, float, boolean, else string.
pub fn scalar(text: &str) -> Value {
    if let Ok(i) = text.parse::<i64>() {
        Value::from(i)
    } else if let Ok(f) = text.parse::<f64>() {
        Value::from(f)
    } else if let Ok(b) = text.parse::<bool>() {
        Value::Bool(b)
    } else {
        Value::String(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of more nodes than the parser's default budget (a budget table at width)
    /// reads; an alias expansion bomb is still refused.
    #[test]
    fn large_files_read_and_alias_bombs_do_not() {
        let mut text = String::from("edges:\n");
        for i in 0..70_000 {
            text += &format!("- caller: a{i}\n  callee: b{i}\n  timeout: 100ms\n  attempts: 1\n");
        }
        let value = parse(&text, Format::Yaml).unwrap();
        assert_eq!(value["edges"].as_array().map(Vec::len), Some(70_000));

        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            bomb += &format!("a{i}: &a{i} [{refs}]\n");
        }
        let error = parse(&bomb, Format::Yaml).unwrap_err();
        assert!(error.contains("is not valid YAML"), "{error}");
    }
}
