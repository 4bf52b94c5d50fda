//! Which NVML GPU a CUDA device is: `--gpu`'s lines name devices by CUDA's ordinal (CUPTI's
//! device id, as the process sees them), `--power`'s by NVML's index. Nothing in either
//! record ties the two for sure (CUPTI's kernel record has only the ordinal), so the map
//! follows what CUDA documents about its numbering, from the command's environment at the
//! start of the run (the `gpu` header's `cuda_visible_devices`, `cuda_device_order`):
//!
//! - NVML sees one GPU: every CUDA device is it (CUDA cannot see a GPU NVML does not);
//! - `CUDA_VISIBLE_DEVICES` lists UUIDs (`GPU-...`, or a unique prefix of one): CUDA
//!   device N is the NVML GPU with the Nth entry's UUID. Sure;
//! - it lists numbers: CUDA device N is NVML GPU `entry N`, and unset, CUDA device N is
//!   NVML GPU N. **Assumed**: CUDA numbers the GPUs as NVML does. True with
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID` (both then go by PCI bus), and with CUDA's default
//!   (fastest first, ties by PCI bus) on a machine of one GPU model; not on a machine
//!   mixing models;
//! - an entry that is neither (`MIG-...`), or no entry for the ordinal: not known.
//!
//! CUDA reads the list up to its first invalid entry; so does this map. A process that
//! changes `CUDA_VISIBLE_DEVICES` itself (before `cuInit`) is not seen.

use serde::Serialize;

/// How a CUDA device was matched to an NVML GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMap {
    /// NVML's GPUs: (index, UUID).
    nvml: Vec<(u32, String)>,
    /// `CUDA_VISIBLE_DEVICES`'s entries, up to the first invalid one; `None`: unset.
    visible: Option<Vec<String>>,
    pci_order: bool,
}

/// One CUDA device's match (`cudatrace summary --json`'s `power.kernels.devices`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceMatch {
    pub cuda_device: u32,
    /// NVML's index; absent when not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_index: Option<u32>,
    /// Why (or why not).
    pub how: String,
    /// The match rests on an assumption (docs/power.md).
    pub assumed: bool,
}

impl DeviceMap {
    /// `nvml`: NVML's GPUs as (index, UUID); `visible` and `order`: the command's
    /// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`.
    pub fn new(nvml: Vec<(u32, String)>, visible: Option<&str>, order: Option<&str>) -> Self {
        DeviceMap {
            visible: visible.map(|list| {
                list.split(',')
                    .map(str::trim)
                    .take_while(|entry| is_index(entry) || entry.starts_with("GPU-"))
                    .map(str::to_owned)
                    .collect()
            }),
            nvml,
            pci_order: order.is_some_and(|order| order.trim() == "PCI_BUS_ID"),
        }
    }

    /// The NVML GPU of CUDA device `ordinal`.
    pub fn nvml(&self, ordinal: u32) -> DeviceMatch {
        let found = |nvml_index: Option<u32>, how: String, assumed: bool| DeviceMatch {
            cuda_device: ordinal,
            nvml_index,
            how,
            assumed,
        };
        let numbered = |index: u32, how: String| {
            let known = self.nvml.iter().any(|(i, _)| *i == index);
            match (known, self.pci_order) {
                (false, _) => found(None, format!("{how}: NVML has no GPU {index}"), false),
                (true, true) => found(
                    Some(index),
                    format!(
                        "{how}, CUDA_DEVICE_ORDER=PCI_BUS_ID: assumed to number GPUs as NVML does"
                    ),
                    true,
                ),
                (true, false) => found(
                    Some(index),
                    format!(
                        "{how}: ASSUMED CUDA numbers GPUs as NVML does (true on a machine of one \
                         GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID)"
                    ),
                    true,
                ),
            }
        };
        if let [(index, _)] = self.nvml.as_slice() {
            return found(Some(*index), "the only GPU NVML sees".into(), false);
        }
        let Some(visible) = &self.visible else {
            return numbered(ordinal, "CUDA_VISIBLE_DEVICES unset".into());
        };
        let Some(entry) = visible.get(ordinal as usize) else {
            return found(
                None,
                format!(
                    "CUDA_VISIBLE_DEVICES={} has no device {ordinal}",
                    visible.join(",")
                ),
                false,
            );
        };
        let how = format!("CUDA_VISIBLE_DEVICES entry {ordinal} is {entry}");
        if let Ok(index) = entry.parse::<u32>() {
            return numbered(index, how);
        }
        let matching: Vec<u32> = self
            .nvml
            .iter()
            .filter(|(_, uuid)| !uuid.is_empty() && uuid.starts_with(entry.as_str()))
            .map(|(index, _)| *index)
            .collect();
        match matching.as_slice() {
            [index] => found(Some(*index), format!("{how}: by UUID"), false),
            [] => found(None, format!("{how}: no NVML GPU has that UUID"), false),
            _ => found(None, format!("{how}: several NVML GPUs match"), false),
        }
    }
}

fn is_index(entry: &str) -> bool {
    !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: u32) -> Vec<(u32, String)> {
        (0..n)
            .map(|i| (i, format!("GPU-0000000{i}-aaaa")))
            .collect()
    }

    fn nvml(map: &DeviceMap, ordinal: u32) -> (Option<u32>, bool) {
        let found = map.nvml(ordinal);
        (found.nvml_index, found.assumed)
    }

    #[test]
    fn one_gpu_is_every_cuda_device() {
        let map = DeviceMap::new(gpus(1), None, None);
        assert_eq!(map.nvml(0).how, "the only GPU NVML sees");
        assert_eq!(nvml(&map, 0), (Some(0), false));
    }

    #[test]
    fn unset_the_ordinal_is_assumed_to_be_the_index() {
        let map = DeviceMap::new(gpus(4), None, None);
        assert_eq!(nvml(&map, 2), (Some(2), true));
        assert!(
            map.nvml(2)
                .how
                .starts_with("CUDA_VISIBLE_DEVICES unset: ASSUMED")
        );
        assert_eq!(nvml(&map, 4), (None, false));
        let pci = DeviceMap::new(gpus(4), None, Some("PCI_BUS_ID"));
        assert!(pci.nvml(1).how.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"));
    }

    #[test]
    fn visible_numbers_reorder_and_uuids_match_for_sure() {
        let map = DeviceMap::new(gpus(4), Some("3, 1"), None);
        assert_eq!(nvml(&map, 0), (Some(3), true));
        assert_eq!(nvml(&map, 1), (Some(1), true));
        assert_eq!(nvml(&map, 2), (None, false));
        assert_eq!(map.nvml(2).how, "CUDA_VISIBLE_DEVICES=3,1 has no device 2");
        let map = DeviceMap::new(gpus(4), Some("GPU-00000002,GPU-0000000"), None);
        assert_eq!(nvml(&map, 0), (Some(2), false));
        assert_eq!(
            map.nvml(0).how,
            "CUDA_VISIBLE_DEVICES entry 0 is GPU-00000002: by UUID"
        );
        assert_eq!(
            map.nvml(1).how,
            "CUDA_VISIBLE_DEVICES entry 1 is GPU-0000000: several NVML GPUs match"
        );
    }

    #[test]
    fn the_list_ends_at_its_first_invalid_entry() {
        let map = DeviceMap::new(gpus(4), Some("2,MIG-abc,1"), None);
        assert_eq!(nvml(&map, 0), (Some(2), true));
        assert_eq!(nvml(&map, 1), (None, false));
        assert_eq!(
            nvml(&DeviceMap::new(gpus(4), Some(""), None), 0),
            (None, false)
        );
    }
}
