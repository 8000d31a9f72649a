//! Output formatting shared by all commands: tables, json/yaml, dot, trees; colour policy in one place.
