//! What one sample reads from NVML, field by field, and the GPUs as the header describes
//! them. Each field is tried once per GPU when tracing starts: one the GPU does not support
//! (or the library does not export) is listed in the header's `unsupported` and never read
//! again; any other error is counted wherever it happens.

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, TemperatureSensor},
    enums::device::SampleValue,
    error::NvmlError,
    structs::device::FieldId,
};

use super::library::error_name;
use crate::schema::{ENERGY_FROM_COUNTER, ENERGY_FROM_POWER, PowerDevice, PowerLine};

/// nvml.h's `NVML_FI_DEV_POWER_INSTANT`: the power now (not the 1 s average).
const FI_DEV_POWER_INSTANT: u32 = 186;

/// A reading of a sample, in the order they are read: the energy counter last, closest to
/// the time stamp taken after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    SmClock,
    MemClock,
    Utilization,
    Temperature,
    MemoryUsed,
    PowerInstant,
    Power,
    Energy,
}

pub const FIELDS: [Field; 8] = [
    Field::SmClock,
    Field::MemClock,
    Field::Utilization,
    Field::Temperature,
    Field::MemoryUsed,
    Field::PowerInstant,
    Field::Power,
    Field::Energy,
];

impl Field {
    /// Its key in a power line (`errors`, `unsupported`): the line's field name;
    /// `utilization` for both utilisation fields (one call).
    pub fn key(self) -> &'static str {
        match self {
            Field::SmClock => "sm_clock_mhz",
            Field::MemClock => "mem_clock_mhz",
            Field::Utilization => "utilization",
            Field::Temperature => "temperature_c",
            Field::MemoryUsed => "memory_used_bytes",
            Field::PowerInstant => "power_instant_mw",
            Field::Power => "power_mw",
            Field::Energy => "energy_mj",
        }
    }

    /// The NVML function that reads it.
    pub fn function(self) -> &'static str {
        match self {
            Field::SmClock | Field::MemClock => "nvmlDeviceGetClockInfo",
            Field::Utilization => "nvmlDeviceGetUtilizationRates",
            Field::Temperature => "nvmlDeviceGetTemperature",
            Field::MemoryUsed => "nvmlDeviceGetMemoryInfo_v2",
            Field::PowerInstant => "nvmlDeviceGetFieldValues",
            Field::Power => "nvmlDeviceGetPowerUsage",
            Field::Energy => "nvmlDeviceGetTotalEnergyConsumption",
        }
    }

    /// Reads the field into `line`.
    pub fn read(self, device: &Device<'_>, line: &mut PowerLine) -> Result<(), NvmlError> {
        match self {
            Field::SmClock => line.sm_clock_mhz = Some(device.clock_info(Clock::SM)?),
            Field::MemClock => line.mem_clock_mhz = Some(device.clock_info(Clock::Memory)?),
            Field::Utilization => {
                let rates = device.utilization_rates()?;
                line.gpu_util_pct = Some(rates.gpu);
                line.mem_util_pct = Some(rates.memory);
            }
            Field::Temperature => {
                line.temperature_c = Some(device.temperature(TemperatureSensor::Gpu)?)
            }
            Field::MemoryUsed => line.memory_used_bytes = Some(device.memory_info()?.used),
            Field::PowerInstant => line.power_instant_mw = Some(instant_power(device)?),
            Field::Power => line.power_mw = Some(device.power_usage()?),
            Field::Energy => line.energy_mj = Some(device.total_energy_consumption()?),
        }
        Ok(())
    }
}

fn instant_power(device: &Device<'_>) -> Result<u32, NvmlError> {
    let mut values = device.field_values_for(&[FieldId(FI_DEV_POWER_INSTANT)])?;
    let sample = values.pop().ok_or(NvmlError::NotSupported)??;
    match sample.value? {
        SampleValue::U32(mw) => Ok(mw),
        SampleValue::U64(mw) => Ok(u32::try_from(mw).unwrap_or(u32::MAX)),
        SampleValue::I64(mw) => Ok(u32::try_from(mw.max(0)).unwrap_or(u32::MAX)),
        SampleValue::F64(mw) => Ok(mw.clamp(0.0, f64::from(u32::MAX)) as u32),
    }
}

/// An error that means the field will never be read on this GPU.
fn never_available(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

/// A GPU to sample: its index and the fields it gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampled {
    pub index: u32,
    pub fields: Vec<Field>,
}

/// Every GPU NVML sees, described for the header and probed for its fields.
pub fn describe(nvml: &Nvml) -> Result<(Vec<PowerDevice>, Vec<Sampled>), String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount_v2: {}", error_name(&e)))?;
    if count == 0 {
        return Err("NVML sees no GPU".into());
    }
    let mut described = Vec::new();
    let mut sampled = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("nvmlDeviceGetHandleByIndex_v2({index}): {}", error_name(&e)))?;
        let mut fields = Vec::new();
        let mut unsupported = Vec::new();
        let mut probe = PowerLine::default();
        for field in FIELDS {
            match field.read(&device, &mut probe) {
                Err(error) if never_available(&error) => {
                    unsupported.push(format!("{}: {}", field.key(), error_name(&error)))
                }
                _ => fields.push(field),
            }
        }
        let energy_counter = fields.contains(&Field::Energy);
        described.push(PowerDevice {
            index,
            name: device
                .name()
                .unwrap_or_else(|e| format!("? ({})", error_name(&e))),
            uuid: device
                .uuid()
                .unwrap_or_else(|e| format!("? ({})", error_name(&e))),
            power_limit_mw: device.power_management_limit().ok(),
            energy_counter,
            energy_source: if energy_counter {
                ENERGY_FROM_COUNTER
            } else {
                ENERGY_FROM_POWER
            }
            .into(),
            unsupported,
        });
        sampled.push(Sampled { index, fields });
    }
    Ok((described, sampled))
}
