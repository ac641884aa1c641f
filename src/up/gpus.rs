//! `up --device cuda[:N]`: which GPU each rank computes on, decided once, before any child
//! starts, from what the driver reports to this process (after `CUDA_VISIBLE_DEVICES`).
//!
//! - `cuda`: the ranks go round the visible GPUs, rank r on `cuda:(r mod count)`; one rank per
//!   GPU unless `--dp-size` says otherwise (more ranks than GPUs share them, which is
//!   supported: they split the GPU's memory).
//! - `cuda:N`: every rank on GPU N; one rank unless `--dp-size` says otherwise.
//!
//! Not for `cpu` or `sim` ranks, which get `--device` as given. A probe that fails (no driver,
//! no GPU, no GPU N, a CUDA library missing) stops `up` with the probe's one line, as the
//! worker would have.

use kernels::cuda::{CudaError, DeviceInfo};
use worker::{Device, WorkerError};

/// The GPUs of `up`'s ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuPlacement {
    /// `--device cuda`: rank r on GPU r mod `visible`.
    Spread { visible: u32 },
    /// `--device cuda:N`: every rank on GPU `ordinal`.
    Pinned { ordinal: u32 },
}

impl GpuPlacement {
    /// The placement `device` asks for, checked with `probe` (`kernels::cuda::probe`, injected
    /// so tests need no driver): `None` for a device that is not a GPU, or the probe's reason as
    /// [`WorkerError::DeviceUnavailable`] (EX_CONFIG, like the worker's refusal).
    pub fn for_device(
        device: Device,
        probe: impl FnOnce(u32) -> Result<DeviceInfo, CudaError>,
    ) -> Result<Option<(GpuPlacement, DeviceInfo)>, WorkerError> {
        let placement = match device {
            Device::Cpu | Device::Sim => return Ok(None),
            // GPU 0 answers for all: the count is the driver's, whichever GPU is asked.
            Device::Cuda(None) => GpuPlacement::Spread { visible: 0 },
            Device::Cuda(Some(ordinal)) => GpuPlacement::Pinned { ordinal },
        };
        let asked = match placement {
            GpuPlacement::Spread { .. } => 0,
            GpuPlacement::Pinned { ordinal } => ordinal,
        };
        let info = probe(asked).map_err(|e| WorkerError::DeviceUnavailable {
            device: device.to_string(),
            why: e.to_string(),
        })?;
        let placement = match placement {
            // A probe that succeeds saw at least GPU 0; `max` keeps `gpu_of` total anyway.
            GpuPlacement::Spread { .. } => GpuPlacement::Spread {
                visible: info.device_count.max(1),
            },
            pinned => pinned,
        };
        Ok(Some((placement, info)))
    }

    /// The GPU `rank` computes on.
    pub fn gpu_of(self, rank: u32) -> u32 {
        match self {
            GpuPlacement::Spread { visible } => rank % visible.max(1),
            GpuPlacement::Pinned { ordinal } => ordinal,
        }
    }

    /// Ranks `up` starts when `--dp-size` is not given: one per GPU it may use.
    pub fn default_ranks(self) -> u32 {
        match self {
            GpuPlacement::Spread { visible } => visible.max(1),
            GpuPlacement::Pinned { .. } => 1,
        }
    }

    /// How many of `ranks` ranks compute on `rank`'s GPU (itself included): they split its
    /// memory, so each takes that share of `--mem-fraction`.
    pub fn sharing(self, rank: u32, ranks: u32) -> u32 {
        let gpu = self.gpu_of(rank);
        (0..ranks).filter(|&r| self.gpu_of(r) == gpu).count() as u32
    }

    /// `rank:cuda:N` for each of `ranks` ranks, for the start-up log line.
    pub fn describe(self, ranks: u32) -> String {
        (0..ranks)
            .map(|r| format!("{r}:cuda:{}", self.gpu_of(r)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(count: u32) -> impl Fn(u32) -> Result<DeviceInfo, CudaError> {
        move |ordinal| {
            if ordinal >= count {
                return Err(CudaError::OrdinalOutOfRange {
                    ordinal,
                    count,
                    visible: "CUDA_VISIBLE_DEVICES unset".into(),
                });
            }
            Ok(DeviceInfo {
                ordinal,
                device_count: count,
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                total_bytes: 141 << 30,
                free_bytes: 140 << 30,
            })
        }
    }

    fn place(device: &str, count: u32) -> GpuPlacement {
        let device: Device = device.parse().unwrap();
        GpuPlacement::for_device(device, gpus(count))
            .unwrap()
            .expect("a GPU device")
            .0
    }

    #[test]
    fn ranks_go_round_the_visible_gpus_or_stay_on_the_one_named() {
        // (device, visible GPUs, ranks, each rank's GPU)
        let cases: &[(&str, u32, u32, &[u32])] = &[
            ("cuda", 2, 2, &[0, 1]),
            ("cuda", 2, 3, &[0, 1, 0]),
            ("cuda", 1, 2, &[0, 0]),
            ("cuda", 8, 4, &[0, 1, 2, 3]),
            ("cuda", 3, 7, &[0, 1, 2, 0, 1, 2, 0]),
            ("cuda:1", 2, 3, &[1, 1, 1]),
            ("cuda:0", 1, 2, &[0, 0]),
        ];
        for &(device, visible, ranks, want) in cases {
            let p = place(device, visible);
            let got: Vec<u32> = (0..ranks).map(|r| p.gpu_of(r)).collect();
            assert_eq!(got, want, "{device} on {visible} GPUs, {ranks} ranks");
        }
    }

    #[test]
    fn without_dp_size_one_rank_per_gpu() {
        assert_eq!(place("cuda", 2).default_ranks(), 2);
        assert_eq!(place("cuda", 8).default_ranks(), 8);
        assert_eq!(place("cuda:3", 8).default_ranks(), 1);
    }

    #[test]
    fn ranks_sharing_a_gpu_split_it() {
        let p = place("cuda", 2);
        // 3 ranks on 2 GPUs: ranks 0 and 2 share GPU 0, rank 1 has GPU 1 alone.
        let shares: Vec<u32> = (0..3).map(|r| p.sharing(r, 3)).collect();
        assert_eq!(shares, [2, 1, 2]);
        assert_eq!(place("cuda:1", 2).sharing(0, 4), 4);
        assert_eq!(p.describe(3), "0:cuda:0 1:cuda:1 2:cuda:0");
    }

    #[test]
    fn cpu_and_sim_are_not_placed_and_never_probe() {
        for device in [Device::Cpu, Device::Sim] {
            let placed = GpuPlacement::for_device(device, |_| panic!("probed for {device}"));
            assert_eq!(placed.unwrap(), None);
        }
    }

    #[test]
    fn a_failed_probe_is_the_worker_s_refusal_of_the_device_as_given() {
        let cases = [
            (
                "cuda",
                CudaError::LibraryMissing(kernels::cuda::CudaLibrary::Driver),
            ),
            (
                "cuda",
                CudaError::NoDevice {
                    visible: "CUDA_VISIBLE_DEVICES=".into(),
                },
            ),
        ];
        for (device, error) in cases {
            let why = error.to_string();
            let err =
                GpuPlacement::for_device(device.parse().unwrap(), |_| Err(error)).unwrap_err();
            assert!(err.is_config_error());
            assert_eq!(err.to_string(), format!("--device {device}: {why}"));
        }
        let err = GpuPlacement::for_device("cuda:5".parse().unwrap(), gpus(2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--device cuda:5: there is no GPU 5: 2 visible (CUDA_VISIBLE_DEVICES unset)"
        );
    }
}
