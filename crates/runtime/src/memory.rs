//! What the process can read about its own memory: the limit of the cgroup it runs in (the
//! container's, the pod's, the systemd unit's) and its resident size now.
//!
//! Both read Linux's files (`/proc/self/cgroup`, `/sys/fs/cgroup`, `/proc/self/status`);
//! elsewhere they find nothing and the caller falls back to its defaults.

use std::path::{Path, PathBuf};

/// cgroup v1 writes "no limit" as the largest page-aligned `i64`; anything this large is none.
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory limit of the cgroup this process runs in: the smallest of `memory.max` and
/// `memory.high` (v2) or `memory.limit_in_bytes` (v1) over the process's cgroup and its
/// ancestors. `None` when no cgroup limits memory.
pub fn cgroup_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_under(Path::new("/sys/fs/cgroup"), &membership)
}

/// [`cgroup_limit`] with the cgroup mount at `mount` and `/proc/self/cgroup`'s text as
/// `membership`: what the tests call with fixture trees.
pub fn cgroup_limit_under(mount: &Path, membership: &str) -> Option<u64> {
    let mut v2 = None;
    let mut v1 = None;
    for line in membership.lines() {
        // "hierarchy-id:controllers:path"; v2's unified hierarchy is "0::path".
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    let v2_limit = v2.and_then(|path| {
        smallest_up(mount, path, |dir| {
            ["memory.max", "memory.high"]
                .iter()
                .filter_map(|file| read_limit(&dir.join(file)))
                .min()
        })
    });
    v2_limit.or_else(|| {
        v1.and_then(|path| {
            smallest_up(&mount.join("memory"), path, |dir| {
                read_limit(&dir.join("memory.limit_in_bytes")).filter(|&l| l < V1_UNLIMITED)
            })
        })
    })
}

/// The smallest limit `read` finds in the cgroup directory for `path` and in each of its
/// ancestors up to the mount. Inside a container the path the process sees may not exist
/// under the mount (the container's own cgroup is mounted at its root), so the mount's root
/// is always read too.
fn smallest_up(mount: &Path, path: &str, read: impl Fn(&Path) -> Option<u64>) -> Option<u64> {
    let mut dirs: Vec<PathBuf> = vec![mount.to_path_buf()];
    let mut dir = mount.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
        dir.push(part);
        dirs.push(dir.clone());
    }
    dirs.iter().filter_map(|d| read(d)).min()
}

/// A limit file's value: bytes, or `None` for "max" (no limit), a missing or unreadable file.
fn read_limit(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The process's resident set size now (`VmRSS` in `/proc/self/status`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_kib(&status, "VmRSS:").map(|kib| kib * 1024)
}

fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup tree of fixture files under a temporary directory.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Tree {
            let dir = std::env::temp_dir()
                .join(format!("stormglass-cgroup-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Tree(dir)
        }

        fn file(&self, path: &str, text: &str) -> &Tree {
            let file = self.0.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
            self
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A container (cgroup namespace: its cgroup is "/" at the mount's root) limited to
    /// 1 GiB by `memory.max`; "max" and a missing file mean no limit.
    #[test]
    fn v2_container() {
        let t = Tree::new("v2");
        t.file("memory.max", "1073741824\n");
        assert_eq!(cgroup_limit_under(&t.0, "0::/\n"), Some(1 << 30));
        t.file("memory.max", "max\n");
        assert_eq!(cgroup_limit_under(&t.0, "0::/\n"), None);
        assert_eq!(cgroup_limit_under(&t.0.join("absent"), "0::/\n"), None);
    }

    /// Without a cgroup namespace (a systemd unit, a Kubernetes pod seen from the node) the
    /// smallest limit on the way from the mount to the process's cgroup holds, memory.high
    /// included; a path that is not under the mount reads the mount's root only.
    #[test]
    fn v2_nested_takes_the_smallest() {
        let t = Tree::new("v2-nested");
        t.file("memory.max", "max\n")
            .file("kubepods.slice/memory.max", "8589934592\n")
            .file("kubepods.slice/pod1/memory.max", "536870912\n")
            .file("kubepods.slice/pod1/c1/memory.max", "max\n")
            .file("kubepods.slice/pod1/c1/memory.high", "max\n");
        let membership = "0::/kubepods.slice/pod1/c1\n";
        assert_eq!(cgroup_limit_under(&t.0, membership), Some(512 << 20));
        t.file("kubepods.slice/pod1/c1/memory.high", "268435456\n");
        assert_eq!(cgroup_limit_under(&t.0, membership), Some(256 << 20));
        assert_eq!(cgroup_limit_under(&t.0, "0::/elsewhere/x\n"), None);
    }

    /// cgroup v1 (hybrid hosts list v1 controllers before "0::"): the memory controller's
    /// `memory.limit_in_bytes`, its "unlimited" value being none.
    #[test]
    fn v1_memory_controller() {
        let t = Tree::new("v1");
        t.file("memory/docker/abc/memory.limit_in_bytes", "402653184\n")
            .file("memory/memory.limit_in_bytes", "9223372036854771712\n");
        let membership = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/\n";
        assert_eq!(cgroup_limit_under(&t.0, membership), Some(384 << 20));
        assert_eq!(cgroup_limit_under(&t.0, "11:memory:/other\n"), None);
    }

    /// The process's own resident size is read (Linux), and `status` lines parse.
    #[test]
    fn resident_size() {
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  1024 kB\n", "VmRSS:"),
            Some(1024)
        );
        if cfg!(target_os = "linux") {
            assert!(resident_bytes().is_some_and(|b| b > 1 << 20));
        }
    }
}
