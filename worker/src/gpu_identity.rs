//! A worker's GPU as it announces it in `Hello` (`protocol::GpuInfo`), from what the CUDA probe
//! found. Only the translation: which GPU to use and whether it serves is the CUDA runner's.

use kernels::cuda::DeviceInfo;
use protocol::GpuInfo;

/// `Hello.gpu` for the GPU `info` describes.
pub fn gpu_identity(info: &DeviceInfo) -> GpuInfo {
    let (major, minor) = info.compute_capability;
    GpuInfo {
        ordinal: info.ordinal,
        name: info.name.clone(),
        compute_capability: format!("{major}.{minor}"),
        total_memory_bytes: info.total_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_s_answer_becomes_the_wire_s() {
        let info = DeviceInfo {
            ordinal: 1,
            device_count: 2,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            total_bytes: 141 << 30,
            free_bytes: 140 << 30,
        };
        assert_eq!(
            gpu_identity(&info),
            GpuInfo {
                ordinal: 1,
                name: "NVIDIA H200".into(),
                compute_capability: "9.0".into(),
                total_memory_bytes: 141 << 30,
            }
        );
        assert_eq!(gpu_identity(&info).device(), "cuda:1");
    }
}
