//! Decoding a driver event (`--kernel`) into a [`DriverLine`]: the device, the NVIDIA
//! escape or UVM command and its RM parameters, the kprobed function.

use std::collections::HashMap;

use tracer_common::{DriverEvent, IOCTL_PARAMS_LEN, device_kind, driver_event};

use super::raw::c_string;
use crate::schema::DriverLine;

fn device_name(kind: u32, index: u32) -> String {
    match kind {
        device_kind::CTL => "nvidiactl".into(),
        device_kind::UVM => "nvidia-uvm".into(),
        device_kind::GPU => format!("nvidia{index}"),
        _ => "nvidia-other".into(),
    }
}

/// `_IOC_TYPE` of the NVIDIA control ioctls.
pub const IOC_TYPE_NVIDIA: u32 = b'F' as u32;

/// `NV_ESC_*` names by `_IOC_NR` (open driver headers nv_escape.h and nv-ioctl-numbers.h).
pub fn escape_name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        0x27 => "NV_ESC_RM_ALLOC_MEMORY",
        0x28 => "NV_ESC_RM_ALLOC_OBJECT",
        0x29 => "NV_ESC_RM_FREE",
        0x2A => "NV_ESC_RM_CONTROL",
        0x2B => "NV_ESC_RM_ALLOC",
        0x34 => "NV_ESC_RM_DUP_OBJECT",
        0x35 => "NV_ESC_RM_SHARE",
        0x4A => "NV_ESC_RM_VID_HEAP_CONTROL",
        0x4E => "NV_ESC_RM_MAP_MEMORY",
        0x4F => "NV_ESC_RM_UNMAP_MEMORY",
        0x54 => "NV_ESC_RM_ALLOC_CONTEXT_DMA2",
        0x57 => "NV_ESC_RM_MAP_MEMORY_DMA",
        0x58 => "NV_ESC_RM_UNMAP_MEMORY_DMA",
        0x5E => "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO",
        200 => "NV_ESC_CARD_INFO",
        201 => "NV_ESC_REGISTER_FD",
        206 => "NV_ESC_ALLOC_OS_EVENT",
        207 => "NV_ESC_FREE_OS_EVENT",
        210 => "NV_ESC_CHECK_VERSION_STR",
        211 => "NV_ESC_IOCTL_XFER_CMD",
        212 => "NV_ESC_ATTACH_GPUS_TO_FD",
        218 => "NV_ESC_WAIT_OPEN_COMPLETE",
        _ => return None,
    })
}

/// UVM ioctl names (plain command numbers on /dev/nvidia-uvm; uvm_ioctl.h).
pub fn uvm_name(cmd: u64) -> Option<&'static str> {
    Some(match cmd {
        0x3000_0001 => "UVM_INITIALIZE",
        0x3000_0002 => "UVM_DEINITIALIZE",
        25 => "UVM_REGISTER_GPU_VASPACE",
        27 => "UVM_REGISTER_CHANNEL",
        33 => "UVM_MAP_EXTERNAL_ALLOCATION",
        37 => "UVM_REGISTER_GPU",
        73 => "UVM_CREATE_EXTERNAL_RANGE",
        _ => return None,
    })
}

fn u32_at(bytes: &[u8; IOCTL_PARAMS_LEN], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

/// Decodes a driver event; `functions` names kprobe addresses.
pub fn decode(event: &DriverEvent, functions: &HashMap<u64, String>) -> DriverLine {
    let mut record = DriverLine {
        pid: event.header.pid,
        tid: event.header.tid,
        ts_ns: event.header.ts_ns,
        dur_ns: event.dur_ns,
        ret: event.ret,
        ..DriverLine::default()
    };
    let device = Some(device_name(event.device, event.device_index));
    match event.what {
        driver_event::IOCTL => {
            record.hook = "ioctl".into();
            record.device = device;
            record.fd = Some(event.fd);
            let cmd = event.a as u32;
            record.cmd = Some(format!("{cmd:#x}"));
            if (cmd >> 8) & 0xff == IOC_TYPE_NVIDIA {
                let nr = cmd & 0xff;
                record.escape = Some(nr);
                record.escape_name = escape_name(nr).map(Into::into);
                match nr {
                    0x2A => {
                        record.rm_control_cmd = Some(format!("{:#x}", u32_at(&event.params, 8)))
                    }
                    0x2B => record.rm_class = Some(format!("{:#x}", u32_at(&event.params, 12))),
                    _ => {}
                }
            } else if event.device == device_kind::UVM {
                record.uvm_cmd = Some(event.a);
                record.uvm_name = uvm_name(event.a).map(Into::into);
            }
        }
        driver_event::MMAP => {
            record.hook = "mmap".into();
            record.device = device;
            record.fd = Some(event.fd);
            record.length = Some(event.a);
            record.offset = Some(event.b);
            record.prot = Some(event.c);
            record.flags = Some(event.d);
            if event.ret >= 0 {
                record.addr = Some(format!("{:#x}", event.ret));
            }
        }
        driver_event::XID => {
            record.hook = "xid".into();
            record.xid = Some(event.a);
            record.device = Some(format!("{:#x}", event.b));
            record.message = Some(c_string(&event.params));
        }
        _ => {
            record.hook = "kprobe".into();
            record.function = Some(
                functions
                    .get(&event.a)
                    .cloned()
                    .unwrap_or_else(|| format!("{:#x}", event.a)),
            );
            record.args = Some([
                format!("{:#x}", event.b),
                format!("{:#x}", event.c),
                format!("{:#x}", event.d),
            ]);
            // nvidia_unlocked_ioctl(file, cmd, arg): name the escape like the tracepoint path.
            let cmd = event.c as u32;
            if record.function.as_deref() == Some("nvidia_unlocked_ioctl")
                && (cmd >> 8) & 0xff == IOC_TYPE_NVIDIA
            {
                record.cmd = Some(format!("{cmd:#x}"));
                record.escape = Some(cmd & 0xff);
                record.escape_name = escape_name(cmd & 0xff).map(Into::into);
            }
        }
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::EventHeader;

    #[test]
    fn rm_control_and_alloc_parameters_are_named() {
        let mut event = DriverEvent {
            header: EventHeader {
                kind: 4,
                flags: 0,
                ts_ns: 10,
                pid: 1,
                tid: 2,
            },
            what: driver_event::IOCTL,
            device: device_kind::CTL,
            a: 0xc020_462a,
            ..DriverEvent::default()
        };
        event.params[8..12].copy_from_slice(&0x2080_0102u32.to_le_bytes());
        let record = decode(&event, &HashMap::new());
        assert_eq!(record.escape_name.as_deref(), Some("NV_ESC_RM_CONTROL"));
        assert_eq!(record.rm_control_cmd.as_deref(), Some("0x20800102"));
        assert_eq!(record.device.as_deref(), Some("nvidiactl"));
        event.a = 0xc030_462b;
        event.params[12..16].copy_from_slice(&0xc86fu32.to_le_bytes());
        let record = decode(&event, &HashMap::new());
        assert_eq!(
            (record.escape, record.rm_class.as_deref()),
            (Some(0x2b), Some("0xc86f"))
        );
    }
}
