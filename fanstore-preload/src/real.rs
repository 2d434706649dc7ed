//! The original libc functions, for library code: never call a hooked name
//! through `libc::` from inside the library (it would resolve to our hook).
pub use crate::hooks::cwd::orig::*;
pub use crate::hooks::fd::orig::*;
pub use crate::hooks::inotify::orig::*;
pub use crate::hooks::open::orig::*;
pub use crate::hooks::signal::orig::*;
pub use crate::hooks::stat::orig::*;
pub use crate::hooks::stdio::orig::*;
pub use crate::hooks::attr::orig::*;
pub use crate::hooks::mknod::orig::*;
pub use crate::hooks::rename::orig::*;
pub use crate::hooks::unlink::orig::*;
pub use crate::hooks::xattr::orig::*;
