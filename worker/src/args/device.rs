//! [`DeviceArgs`]: what a worker computes on (CPU kernel path, a GPU, a simulated one), and the
//! value parsers that list a closed set in `--help`.

use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use kernels::KernelPath;

use crate::sim::{SimProfile, DEFAULT_SIM_PROFILE};

/// What the worker computes on (also `up`'s; `bench --engine` has its own `--kernel-path`,
/// which also takes `all`).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct DeviceArgs {
    /// CPU kernel path: `auto` (the widest this CPU supports) or a named one. All give
    /// bit-identical results; forcing one is for tests and benchmarks. A path this CPU cannot
    /// run is refused at start.
    #[arg(long, env = kernels::KERNEL_PATH_ENV, default_value = "auto",
          value_parser = kernel_path_parser())]
    pub kernel_path: KernelPath,
    /// Compute device: `cpu` runs the model; `sim` simulates a GPU rank (real scheduler and
    /// caches, a cost model's step times, pseudo-tokens; see docs/SIM.md); `cuda` or `cuda:N`
    /// serves on NVIDIA GPU N (0 for `cuda`; not yet run on real hardware, see docs/CUDA.md); without a usable driver, GPU or CUDA 13 library the worker exits 78 with why.
    #[arg(long, env = "DPSERVE_DEVICE", default_value = "cpu", value_parser = device_parser())]
    pub device: Device,
    /// `--device sim`: the simulated GPU and model, a built-in profile.
    #[arg(long, env = "DPSERVE_SIM_PROFILE", default_value = DEFAULT_SIM_PROFILE,
          value_parser = clap::builder::PossibleValuesParser::new(SimProfile::BUILTIN))]
    pub sim_profile: String,
    /// `--device sim`: a TOML file whose keys override the profile's (e.g. `gpu_mem_gb = 141`;
    /// `base = "NAME"` picks another built-in profile to start from).
    #[arg(long, env = "DPSERVE_SIM_CONFIG")]
    pub sim_config: Option<PathBuf>,
    /// `--device sim`: step in lock-step with the cluster's other simulated ranks on this host,
    /// as data-parallel attention does (every rank's step ends with the round's slowest; see
    /// docs/SIM.md). `--sim-lock-step` alone means `true`.
    #[arg(long, env = "DPSERVE_SIM_LOCK_STEP", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub sim_lock_step: bool,
}

impl Default for DeviceArgs {
    fn default() -> Self {
        DeviceArgs {
            kernel_path: KernelPath::best(),
            device: Device::Cpu,
            sim_profile: DEFAULT_SIM_PROFILE.to_string(),
            sim_config: None,
            sim_lock_step: false,
        }
    }
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU kernels.
    Cpu,
    /// A simulated GPU rank: the forward pass replaced by a roofline cost model that sleeps
    /// for the modelled step time and emits pseudo-tokens.
    Sim,
    /// An NVIDIA GPU through the CUDA backend (`kernels::cuda`): `cuda:N` is GPU N as the
    /// driver numbers them after `CUDA_VISIBLE_DEVICES`; plain `cuda` (`None`) is GPU 0 for a
    /// worker.
    Cuda(Option<u32>),
}

impl Device {
    /// The names `--help` lists.
    pub const NAMES: [&'static str; 4] = ["cpu", "sim", "cuda", "cuda:N"];

    /// The GPU ordinal a worker on this device uses, for a CUDA device.
    pub fn cuda_ordinal(self) -> Option<u32> {
        match self {
            Device::Cuda(n) => Some(n.unwrap_or(0)),
            Device::Cpu | Device::Sim => None,
        }
    }

    /// Why a worker on this device cannot take a disaggregated role (`--disaggregation-mode
    /// prefill|decode`), if it cannot: `up` refuses such a deployment with the same words
    /// before it starts anything.
    pub fn disagg_refusal(self) -> Option<String> {
        match self {
            Device::Cpu => None,
            Device::Sim => Some("--device sim does not simulate disaggregated roles yet".into()),
            Device::Cuda(_) => Some(format!(
                "--device {self} does not serve disaggregated roles yet (the KV transfer is \
                 CPU-only); use --device cpu for prefill/decode disaggregation"
            )),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Sim => f.write_str("sim"),
            Device::Cuda(None) => f.write_str("cuda"),
            Device::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "sim" => Ok(Device::Sim),
            "cuda" => Ok(Device::Cuda(None)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(|| {
                    format!("`{s}` is not a device: one of cpu, sim, cuda, cuda:N")
                })?;
                // Digits only: `u32::from_str` also takes a leading `+`.
                let ordinal = n
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| n.parse::<u32>().ok())
                    .flatten();
                ordinal.map(|n| Device::Cuda(Some(n))).ok_or_else(|| {
                    format!("the GPU ordinal in `{s}` must be a number: cuda:0, cuda:1, ...")
                })
            }
        }
    }
}

/// `--device`'s parser: [`Device`]'s own `FromStr` (which says what is wrong with a GPU
/// ordinal), with [`Device::NAMES`] listed in `--help`.
pub fn device_parser() -> Listed<Device> {
    Listed {
        parse: |s| s.parse::<Device>(),
        names: || Device::NAMES.to_vec(),
    }
}

/// `--device sim`: what a simulated rank models, and the seed of its pseudo-tokens
/// (`--weight-seed`).
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    pub profile: SimProfile,
    pub seed: u64,
    /// `--sim-lock-step`: the state file the cluster's ranks share.
    pub lock_step: Option<PathBuf>,
}

/// The names `--kernel-path` takes: `auto` and every path, supported here or not.
pub fn kernel_path_names() -> impl Iterator<Item = &'static str> {
    std::iter::once("auto").chain(KernelPath::ALL.iter().map(|p| p.name()))
}

/// `--kernel-path`'s parser: [`KernelPath`]'s own `FromStr` (so a path this CPU lacks is
/// refused with the paths it has), with the names listed in `--help`.
pub fn kernel_path_parser() -> Listed<KernelPath> {
    Listed {
        parse: |s| s.parse::<KernelPath>().map_err(|e| e.to_string()),
        names: || kernel_path_names().collect(),
    }
}

/// A value parser for a closed set whose parse says more than "not one of these" (a kernel
/// path this CPU cannot run): `parse` decides, `names` are shown by `--help`.
#[derive(Clone, Copy)]
pub struct Listed<T> {
    pub parse: fn(&str) -> Result<T, String>,
    pub names: fn() -> Vec<&'static str>,
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Listed<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        self.parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new((self.names)().into_iter().map(PossibleValue::new)))
    }
}
