//! `docs/CLI.md`, the command-line reference: every subcommand's every flag with its variable,
//! default, choices and help, generated from the parser `main` uses, so it cannot drift from
//! the code. The test below fails when the committed file differs from what the parser says;
//! `DPSERVE_BLESS=1 cargo test --bin dpserve cli_reference` rewrites it.

use clap::{Arg, Command, CommandFactory};

use crate::Cli;

/// How the reference writes the default runtime directory (`RuntimeDir::default_path`).
const RUNTIME_DIR: &str = "RUNTIME";

/// A cell's text on one line, with the table's separator escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// How the flag is written: `--name <VALUE>`, `--name` for a switch, `<NAME>` for a positional.
fn usage(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    match arg.get_long() {
        Some(long) if arg.get_action().takes_values() => format!("--{long} {value}"),
        Some(long) => format!("--{long}"),
        None => value,
    }
}

/// One row of a subcommand's table.
fn row(arg: &Arg) -> String {
    let env = arg
        .get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_default();
    // The default runtime directory depends on the user and the environment, not the code.
    let runtime_dir = protocol::RuntimeDir::default_path("default");
    let default = arg
        .get_default_values()
        .iter()
        .map(|v| {
            let v = v.to_string_lossy();
            format!(
                "`{}`",
                v.replace(&*runtime_dir.to_string_lossy(), RUNTIME_DIR)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let choices = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect::<Vec<_>>()
        .join(", ");
    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
    format!(
        "| `{}` | {env} | {default} | {} | {} |\n",
        cell(&usage(arg)),
        cell(&choices),
        cell(&help)
    )
}

/// The section of `cmd` (reached by `path`) and of its subcommands.
fn section(cmd: &Command, path: &str, out: &mut String) {
    out.push_str(&format!("\n## `{path}`\n\n"));
    if let Some(about) = cmd.get_about() {
        out.push_str(&format!("{}\n\n", cell(&about.to_string())));
    }
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    if args.is_empty() {
        out.push_str("No flags.\n");
    } else {
        out.push_str("| flag | variable | default | choices | meaning |\n|---|---|---|---|---|\n");
        for arg in args {
            out.push_str(&row(arg));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() != "help" {
            section(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
}

/// The whole reference, as `docs/CLI.md` holds it.
pub fn markdown() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Every flag of every `dpserve` subcommand, generated from the parser \
         (`src/cli_reference.rs`; `DPSERVE_BLESS=1 cargo test --bin dpserve cli_reference` \
         rewrites this file, and the test fails while it is stale). Each flag also reads the \
         variable beside it; a flag given beats its variable. `RUNTIME` in a default is \
         `$XDG_RUNTIME_DIR/dpserve-default`, or `/tmp/dpserve-<uid>-default` without it. \
         [FLAGS.md](FLAGS.md) explains the flags that need more than a line; `up` and \
         `bench --launch` pass the actors' flags on to them \
         ([ARCHITECTURE.md](ARCHITECTURE.md#command-line--contract)).\n",
    );
    section(&cmd, "dpserve", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/CLI.md")
    }

    #[test]
    fn cli_reference_is_what_the_parser_says() {
        let generated = markdown();
        let path = committed_path();
        if std::env::var_os("DPSERVE_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write docs/CLI.md");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/CLI.md differs from what the parser says; regenerate it with \
             `DPSERVE_BLESS=1 cargo test --bin dpserve cli_reference` and commit it"
        );
    }

    #[test]
    fn every_subcommand_and_flag_of_the_contract_is_in_the_reference() {
        let doc = markdown();
        for sub in [
            "up",
            "tokenizer",
            "controller",
            "worker",
            "bench",
            "trace",
            "keygen",
        ] {
            assert!(doc.contains(&format!("## `dpserve {sub}`")), "{sub}");
        }
        for flag in [
            "--weight-cache <DIR>",
            "--dp-size <",
            "--curve-secret-key <",
        ] {
            assert!(doc.contains(flag), "{flag}");
        }
        // Five cells a row: help text with a `|` or a line break does not break the table.
        for line in doc.lines().filter(|l| l.starts_with("| `")) {
            assert_eq!(line.replace("\\|", "").matches('|').count(), 6, "{line}");
        }
    }
}
