//! `replaces`: the names of limits a rate limit drops from the same
//! request.

use super::tree::Yaml;
use super::yaml::{Walker, join, kind, line_of};

pub(super) const REPLACES_KEYS: &[&str] = &["name"];

impl Walker<'_> {
    pub(super) fn replaces(&mut self, node: &Yaml, path: &str, own: Option<&str>) -> Vec<String> {
        let Some(items) = node.as_sequence() else {
            self.error(
                line_of(node),
                path,
                format!("expected a list of {{name: ...}}, found {}", kind(node)),
            );
            return Vec::new();
        };
        let mut names = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(map) = item.as_mapping() else {
                self.error(
                    line_of(item),
                    &item_path,
                    format!("expected a mapping {{name: ...}}, found {}", kind(item)),
                );
                continue;
            };
            let fields = self.fields(map, &item_path, REPLACES_KEYS);
            let name_path = join(&item_path, "name");
            let name = match fields.get("name") {
                Some((_, v)) => self.string(v, &name_path).map(|n| (n, line_of(v))),
                None => Some((String::new(), line_of(item))),
            };
            match name {
                Some((n, line)) if n.is_empty() => {
                    self.error(line, &name_path, "empty replaces name");
                }
                Some((n, line)) if Some(n.as_str()) == own => {
                    self.error(
                        line,
                        &name_path,
                        format!("a rate limit cannot replace itself ({n:?} is its own name)"),
                    );
                }
                Some((n, _)) => names.push(n),
                None => {}
            }
        }
        names
    }
}
