//go:build linux

package cabi

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// expectLines checks that out holds every line of each case, one subtest per case.
func expectLines(t *testing.T, out string, cases []struct{ name, lines string }) {
	t.Helper()
	have := make(map[string]bool)
	for _, l := range strings.Split(out, "\n") {
		have[l] = true
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, l := range strings.Split(strings.TrimSpace(c.lines), "\n") {
				if l = strings.TrimSpace(l); !have[l] {
					t.Errorf("missing %q", l)
				}
			}
		})
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// TestPaths runs testdata/paths.c, which looks at the device's paths through each libc entry
// point the shim maps (docs/cabi.md, "Paths"), and checks each answer against what an EFA host
// gives: the node a character device 231:250 that may be read and written, the class entries
// relative links into the PCI device's directory, that directory's vendor and device, the
// listings of the class and /dev directories holding the device alone, and the port's tx_bytes
// rising with traffic sent in the same process.
func TestPaths(t *testing.T) {
	exe := buildC(t, "paths")
	s := setupOrSkip(t)
	out := run(t, s, "", time.Minute, exe)
	expectLines(t, out, []struct{ name, lines string }{
		{"access", `
			access dev rw: ok
			access dev x: Permission denied
			access vendor: ok`},
		{"faccessat", `
			faccessat dev: ok
			faccessat devdir node: ok`},
		{"faccessat2", `
			faccessat2 eaccess: ok
			faccessat2 nofollow: ok`},
		{"euidaccess", `
			euidaccess dev: ok
			eaccess numa_node: ok`},
		{"stat", `
			stat dev: chr 231:250 666
			stat ibdev: dir
			lstat ibdev: lnk
			stat local_cpus: reg
			fstatat devdir node: chr 231:250 666
			fstatat sysdir vendor: reg`},
		{"statx", `
			statx dev: chr 231:250
			statx ibdev nofollow: lnk
			statx devdir node: chr`},
		{"open", `
			open vendor: 0x1d0f
			open dotdot: Unknown
			open verbs ibdev: efa_0
			open dev char: 0x1d0f
			open driver: 0xefa1`},
		{"openat", `
			openat device: 0xefa1
			openat classdir gid type: IB/RoCE v1
			openat sysdir state: 4: ACTIVE`},
		{"opendir", `
			opendir class: efa_0(l)
			opendir verbs: abi_version uverbs_softefa0(l)
			opendir dev: uverbs_softefa0(c)
			opendir types: 0
			fdopendir pci: class device driver(l) infiniband infiniband_verbs local_cpulist local_cpus modalias numa_node subsystem_device subsystem_vendor vendor`},
		{"parents", `
			opendir sys class: infiniband infiniband_verbs
			opendir /dev: infiniband
			fdopendir pci0000:00: 0000:00:06.0
			opendir drivers: efa`},
		{"scandir", `
			scandir verbs: abi_version uverbs_softefa0
			scandir dev: uverbs_softefa0
			scandir sys class: infiniband infiniband_verbs`},
		{"readlink", `
			readlink ibdev: ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0
			readlink device: ../../../0000:00:06.0
			readlink driver: ../../../bus/pci/drivers/efa
			readlinkat classdir: ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0
			readlink verbs: ../../devices/pci0000:00/0000:00:06.0/infiniband_verbs/uverbs_softefa0`},
		{"realpath", `
			realpath ibdev: /sys/devices/pci0000:00/0000:00:06.0/infiniband/efa_0
			realpath driver: /sys/bus/pci/drivers/efa
			canonicalize ports: /sys/devices/pci0000:00/0000:00:06.0/infiniband/efa_0/ports/1
			realpath dev: /dev/infiniband/uverbs_softefa0`},
		{"syscall", `
			syscall openat2 vendor: 0x1d0f
			syscall openat2 dev: ok
			syscall openat2 dev null how: Bad address
			syscall openat vendor: 0x1d0f
			syscall newfstatat dev: chr 231:250 666
			syscall stat dev: chr 231:250 666
			syscall statx dev: chr
			syscall access dev: ok
			syscall faccessat2 dev: ok
			syscall readlinkat ibdev: ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0
			syscall getpid: ok`},
		{"chdir", `
			getcwd: /sys/devices/pci0000:00/0000:00:06.0
			open relative: 0x1d0f`},
	})
	t.Run("hw_counters", func(t *testing.T) {
		if !strings.Contains(out, "tx_bytes: rose (") {
			t.Errorf("tx_bytes did not rise with the traffic:\n%s", out)
		}
	})
}

// TestPathsPython looks at the device's paths through Python's os module (testdata/paths.py):
// os.stat, os.access, os.listdir and os.scandir (opendir and fdopendir), os.readlink,
// os.path.realpath (lstat and readlink, component by component) and os.walk.
func TestPathsPython(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := exec.LookPath(python); err != nil {
		t.Skip(err)
	}
	s := setupOrSkip(t)
	out := run(t, s, "", time.Minute, python, "testdata/paths.py")
	expectLines(t, out, []struct{ name, lines string }{
		{"stat", `
			os.stat dev: chr 231:250
			os.path.exists dev: True
			os.lstat ibdev: True
			os.path.isdir ibdev: True
			os.stat dir_fd: True`},
		{"access", `
			os.access dev: True
			os.access effective: True`},
		{"listdir", `
			os.listdir class: ['efa_0']
			os.listdir dev: ['uverbs_softefa0']
			os.listdir fd: ['efa_0']
			os.walk: ['0']`},
		{"scandir", `
			os.scandir dev: [('uverbs_softefa0', True)]
			os.scandir hw_counters: True`},
		{"readlink", `
			os.readlink: ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0
			os.readlink device: ../../../0000:00:06.0`},
		{"realpath", `
			os.path.realpath: /sys/devices/pci0000:00/0000:00:06.0
			os.path.realpath driver: /sys/bus/pci/drivers/efa`},
		{"open", `
			open vendor: 0x1d0f
			open gid type: IB/RoCE v1`},
	})
}

// TestPathsTools runs ls -l, find and cat on the device's paths (coreutils 9 and findutils 4.9:
// statx, readlink, getxattr, opendir, fts's openat and fstatat on directory fds).
func TestPathsTools(t *testing.T) {
	s := setupOrSkip(t, "sh", "ls", "find", "cat")
	sh := func(t *testing.T, cmd string) string { t.Helper(); return run(t, s, "", time.Minute, "sh", "-c", cmd) }
	t.Run("ls", func(t *testing.T) {
		out := sh(t, "ls -l /dev/infiniband /sys/class/infiniband; ls /sys/class /dev")
		for _, want := range []string{
			"\ninfiniband\ninfiniband_verbs\n",
			"crw-rw-rw- 1 ", " 231, 250 ",
			" efa_0 -> ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("ls -l lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, " 1970 ") {
			t.Errorf("ls -l shows the node made in 1970:\n%s", out)
		}
	})
	t.Run("find", func(t *testing.T) {
		out := sh(t, "find /sys/class/infiniband/efa_0/ -name tx_bytes; find /dev/infiniband -type c; "+
			"find -L /sys/class/infiniband -maxdepth 3 -name vendor; find /sys/class /sys/devices/pci0000:00 -path '*06.0/vendor'")
		want := "/sys/class/infiniband/efa_0/ports/1/hw_counters/tx_bytes\n/dev/infiniband/uverbs_softefa0\n" +
			"/sys/class/infiniband/efa_0/device/vendor\n/sys/devices/pci0000:00/0000:00:06.0/vendor\n"
		if out != want {
			t.Errorf("find: got\n%s\nwant\n%s", out, want)
		}
	})
	t.Run("cat", func(t *testing.T) {
		// The subshell is a fork of a shell that made its device (its [ -d ] looked): its paths
		// are its parent's tree.
		out := sh(t, "cd /sys/class/infiniband/efa_0 && cat device/vendor device/device ports/1/gid_attrs/types/0 ports/1/hw_counters/lifespan; "+
			"[ -d /sys/class/infiniband ] && (cd /sys/class/infiniband/efa_0/device && cat ../0000:00:06.0/infiniband/efa_0/ports/1/rate)")
		if want := "0x1d0f\n0xefa1\nIB/RoCE v1\n10\n100 Gb/sec (4X EDR)\n"; out != want {
			t.Errorf("cat: got %q, want %q", out, want)
		}
	})
}
