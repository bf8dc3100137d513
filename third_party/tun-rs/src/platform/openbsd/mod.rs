mod sys;

mod device;

pub use self::device::DeviceImpl;
