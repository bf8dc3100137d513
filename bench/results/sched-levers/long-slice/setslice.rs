// setslice NICE SLICE_NS TID...: sched_setattr(SCHED_OTHER, nice, sched_runtime = slice)
#[repr(C)]
#[derive(Default)]
struct SchedAttr { size: u32, policy: u32, flags: u64, nice: i32, prio: u32, runtime: u64, deadline: u64, period: u64, umin: u32, umax: u32 }
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let nice: i32 = a[1].parse().unwrap();
    let slice: u64 = a[2].parse().unwrap();
    for t in &a[3..] {
        let tid: i32 = t.parse().unwrap();
        let attr = SchedAttr { size: std::mem::size_of::<SchedAttr>() as u32, nice, runtime: slice, ..Default::default() };
        let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &attr as *const SchedAttr, 0u32) };
        if r != 0 { eprintln!("tid {tid}: {}", std::io::Error::last_os_error()); }
    }
}
