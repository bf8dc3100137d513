mod sys;

mod device;
mod tap;
mod tuntap;

pub use self::device::DeviceImpl;
