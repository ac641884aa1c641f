//! Flags a launcher takes on behalf of its children. `up` and `bench --launch` do not declare
//! the actors' flags again: they flatten the actors' own argument groups wrapped in [`Given`],
//! which parses them as usual and also remembers which ones the user set (on the command line
//! or in the environment) and how, so the launcher passes exactly those on under the actors'
//! own names, and every default stays with the actor that owns it. [`BenchEnv`] reads a group
//! from `DPSERVE_BENCH_<FLAG>` instead of `DPSERVE_<FLAG>`, for `bench`, whose environment is
//! not a deployment's.
//!
//! Not for validation: the groups' own parsers and `resolve`/`check` functions do that.

use std::ffi::OsString;
use std::ops::Deref;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};

/// One flag the user set, as the argv that passes it on.
#[derive(Debug, Clone)]
struct SetFlag {
    id: String,
    argv: Vec<OsString>,
}

/// Flag group `T` plus which of its flags were set; reads like `T` (it derefs to it).
#[derive(Debug, Clone)]
pub struct Given<T> {
    pub value: T,
    set: Vec<SetFlag>,
}

impl<T> Deref for Given<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Args> Given<T> {
    /// The set flags as arguments for a child, in declaration order.
    pub fn argv(&self) -> Vec<OsString> {
        self.argv_without(&[])
    }

    /// [`Given::argv`] less the flags whose ids (field names) are in `skip`: those the
    /// launcher passes itself.
    pub fn argv_without(&self, skip: &[&str]) -> Vec<OsString> {
        self.set
            .iter()
            .filter(|f| !skip.contains(&f.id.as_str()))
            .flat_map(|f| f.argv.iter().cloned())
            .collect()
    }

    /// Whether the user set the flag with this id (field name).
    pub fn is_set(&self, id: &str) -> bool {
        self.set.iter().any(|f| f.id == id)
    }

    /// Unless the user set flag `id`, set it to `value` (as the user would have written it):
    /// `apply` changes the parsed value the same way, and the flag is passed on like a set one.
    /// Returns whether it did. For presets, which sit between the user's flags and the
    /// defaults.
    pub fn default_to(&mut self, id: &str, value: &str, apply: impl FnOnce(&mut T)) -> bool {
        if self.is_set(id) {
            return false;
        }
        let group = T::augment_args(Command::new("given"));
        let Some(long) = group
            .get_arguments()
            .find(|a| a.get_id() == id)
            .and_then(|a| a.get_long())
        else {
            return false;
        };
        apply(&mut self.value);
        self.set.push(SetFlag {
            id: id.to_string(),
            argv: vec![format!("--{long}").into(), value.into()],
        });
        true
    }
}

/// The flags of group `T` that `m` got from the command line or the environment.
fn set_flags<T: Args>(m: &ArgMatches) -> Vec<SetFlag> {
    let group = T::augment_args(Command::new("given"));
    group
        .get_arguments()
        .filter_map(|arg| {
            let id = arg.get_id().as_str();
            let long = arg.get_long()?;
            match m.value_source(id)? {
                ValueSource::CommandLine | ValueSource::EnvVariable => {}
                _ => return None,
            }
            let flag: OsString = format!("--{long}").into();
            let argv = if arg.get_action().takes_values() {
                m.get_raw(id)?
                    .flat_map(|v| [flag.clone(), v.to_owned()])
                    .collect()
            } else if matches!(m.try_get_one::<bool>(id), Ok(Some(true))) {
                vec![flag]
            } else {
                // A switch set to false (`DPSERVE_X=false`): the child's default already is.
                return None;
            };
            Some(SetFlag {
                id: id.to_string(),
                argv,
            })
        })
        .collect()
}

impl<T: FromArgMatches + Args> FromArgMatches for Given<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }

    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        // Before `T` takes its values out of the matches.
        let set = set_flags::<T>(m);
        Ok(Given {
            value: T::from_arg_matches_mut(m)?,
            set,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.update_from_arg_matches_mut(&mut m.clone())
    }

    fn update_from_arg_matches_mut(&mut self, m: &mut ArgMatches) -> Result<(), clap::Error> {
        self.set = set_flags::<T>(m);
        self.value.update_from_arg_matches_mut(m)
    }
}

impl<T: Args> Args for Given<T> {
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }

    fn augment_args(cmd: Command) -> Command {
        T::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        T::augment_args_for_update(cmd)
    }
}

/// Group `T` with each `DPSERVE_<FLAG>` variable read as `DPSERVE_BENCH_<FLAG>`, and its help
/// marked `[--launch]`: the same flags, names, values and defaults, another environment.
#[derive(Debug, Clone)]
pub struct BenchEnv<T>(pub T);

impl<T> Deref for BenchEnv<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// `DPSERVE_X` → `DPSERVE_BENCH_X`.
pub fn bench_env_name(actor_env: &str) -> Option<String> {
    actor_env
        .strip_prefix("DPSERVE_")
        .map(|rest| format!("DPSERVE_BENCH_{rest}"))
}

fn for_bench<T: Args>(mut cmd: Command) -> Command {
    let ids: Vec<clap::Id> = T::augment_args(Command::new("group"))
        .get_arguments()
        .map(|a| a.get_id().clone())
        .collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |arg| {
            let env = arg
                .get_env()
                .and_then(|e| e.to_str())
                .and_then(bench_env_name);
            let help = arg.get_help().map(|h| format!("[--launch] {h}"));
            let long_help = arg.get_long_help().map(|h| format!("[--launch] {h}"));
            let arg = match env {
                Some(env) => arg.env(env),
                None => arg,
            };
            let arg = match help {
                Some(h) => arg.help(h),
                None => arg,
            };
            match long_help {
                Some(h) => arg.long_help(h),
                None => arg,
            }
        });
    }
    cmd
}

impl<T: Args> Args for BenchEnv<T> {
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }

    fn augment_args(cmd: Command) -> Command {
        for_bench::<T>(T::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        for_bench::<T>(T::augment_args_for_update(cmd))
    }
}

impl<T: FromArgMatches> FromArgMatches for BenchEnv<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(BenchEnv(T::from_arg_matches(m)?))
    }

    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        Ok(BenchEnv(T::from_arg_matches_mut(m)?))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }

    fn update_from_arg_matches_mut(&mut self, m: &mut ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(m)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Args, Debug, Clone, PartialEq)]
    struct Group {
        /// A number.
        #[arg(long, env = "DPSERVE_FWD_TEST_NUM", default_value_t = 7)]
        num: u32,
        /// A switch.
        #[arg(long, env = "DPSERVE_FWD_TEST_SWITCH")]
        switch: bool,
        /// A name.
        #[arg(long, env = "DPSERVE_FWD_TEST_NAME")]
        name: Option<String>,
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        group: Given<Group>,
    }

    #[derive(Parser)]
    struct BenchCli {
        #[command(flatten)]
        group: BenchEnv<Given<Group>>,
    }

    fn strings(argv: Vec<OsString>) -> Vec<String> {
        argv.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn only_set_flags_are_passed_on_verbatim() {
        let cli = Cli::try_parse_from(["x", "--name", "a b", "--switch"]).unwrap();
        assert_eq!(cli.group.num, 7, "defaults still apply");
        assert_eq!(strings(cli.group.argv()), ["--switch", "--name", "a b"]);
        assert_eq!(strings(cli.group.argv_without(&["name"])), ["--switch"]);
        assert!(cli.group.is_set("switch") && !cli.group.is_set("num"));
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(cli.group.argv().is_empty());
    }

    #[test]
    fn default_to_fills_only_unset_flags() {
        let mut cli = Cli::try_parse_from(["x", "--num", "3"]).unwrap();
        assert!(!cli.group.default_to("num", "9", |g| g.num = 9));
        assert!(cli
            .group
            .default_to("name", "p", |g| g.name = Some("p".into())));
        assert_eq!(cli.group.num, 3);
        assert_eq!(cli.group.name.as_deref(), Some("p"));
        assert_eq!(strings(cli.group.argv()), ["--num", "3", "--name", "p"]);
    }

    #[test]
    fn bench_env_renames_variables_and_marks_help() {
        let cmd = <BenchCli as clap::CommandFactory>::command();
        let num = cmd.get_arguments().find(|a| a.get_id() == "num").unwrap();
        assert_eq!(
            num.get_env().and_then(|e| e.to_str()),
            Some("DPSERVE_BENCH_FWD_TEST_NUM")
        );
        assert!(num
            .get_help()
            .unwrap()
            .to_string()
            .starts_with("[--launch] "));
        let cli = BenchCli::try_parse_from(["x", "--num", "4"]).unwrap();
        assert_eq!(strings(cli.group.argv()), ["--num", "4"]);
        assert_eq!(
            bench_env_name("DPSERVE_DP_SIZE").unwrap(),
            "DPSERVE_BENCH_DP_SIZE"
        );
    }

    #[derive(clap::Args, Debug, Clone)]
    struct EnvGroup {
        #[arg(long, env = "DPSERVE_FWD_ENV_TEST_NUM", default_value_t = 7)]
        num: u32,
        #[arg(long, env = "DPSERVE_FWD_ENV_TEST_SWITCH")]
        switch: bool,
        #[arg(long, env = "DPSERVE_FWD_ENV_TEST_OFF")]
        off: bool,
    }

    #[derive(Parser)]
    struct EnvCli {
        #[command(flatten)]
        group: BenchEnv<Given<EnvGroup>>,
    }

    #[test]
    fn values_from_the_environment_are_passed_on_as_flags() {
        // Variables no other test reads.
        std::env::set_var("DPSERVE_BENCH_FWD_ENV_TEST_NUM", "5");
        std::env::set_var("DPSERVE_BENCH_FWD_ENV_TEST_SWITCH", "true");
        std::env::set_var("DPSERVE_BENCH_FWD_ENV_TEST_OFF", "false");
        std::env::set_var("DPSERVE_FWD_ENV_TEST_NUM", "6");
        let cli = EnvCli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.group.num, 5, "the bench variable, not the actor's");
        assert_eq!(strings(cli.group.argv()), ["--num", "5", "--switch"]);
    }
}
