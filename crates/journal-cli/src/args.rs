//! A small argument parser: `--name value`, `--flag`, positionals.

use std::collections::BTreeMap;

/// Parsed command-line arguments.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional arguments, in order.
    pub positional: Vec<String>,
    options: BTreeMap<String, Option<String>>,
}

/// Flags that take no value.
const SWITCHES: &[&str] = &["smoke", "entries", "help", "quiet"];

impl Args {
    /// Parses `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut out = Args::default();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                if let Some((k, v)) = name.split_once('=') {
                    out.options.insert(k.to_string(), Some(v.to_string()));
                } else if SWITCHES.contains(&name) {
                    out.options.insert(name.to_string(), None);
                } else {
                    let v = it.next().ok_or(format!("--{name} needs a value"))?;
                    out.options.insert(name.to_string(), Some(v));
                }
            } else {
                out.positional.push(a);
            }
        }
        Ok(out)
    }

    /// Whether a switch is present.
    pub fn flag(&self, name: &str) -> bool {
        self.options.contains_key(name)
    }

    /// The value of an option.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.options.get(name).and_then(|v| v.as_deref())
    }

    /// A parsed value, or `default`.
    pub fn parsed<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name}: cannot parse {v:?}")),
        }
    }

    /// A comma-separated list of numbers, or `default`.
    pub fn list(&self, name: &str, default: &[usize]) -> Result<Vec<usize>, String> {
        match self.value(name) {
            None => Ok(default.to_vec()),
            Some(v) => v
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse()
                        .map_err(|_| format!("--{name}: bad number {x:?}"))
                })
                .collect(),
        }
    }

    /// Rejects options not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        for k in self.options.keys() {
            if !known.contains(&k.as_str()) {
                return Err(format!("unknown option --{k}"));
            }
        }
        Ok(())
    }
}
