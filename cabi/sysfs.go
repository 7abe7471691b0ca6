//go:build linux

package cabi

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/softefa/softefa/internal/uverbs"
)

// Sysfs describes the device a generated sysfs tree shows (docs/cabi.md, "Sysfs, per process").
type Sysfs struct {
	IBDev        string // efa_0
	Uverbs       string // the class/infiniband_verbs entry and the /dev/infiniband node name
	Major, Minor int    // the node's dev_t, which fstat of an open node reports
	GID          [16]byte
	VendorPartID uint32
	PCIAddr      string // the PCI address the device dir is named after, 0000:00:06.0
	SpeedGbps    int    // the port's link speed: 100 (4X EDR, the default) or 400 (8X HDR)
}

// DevPath is the device node libibverbs opens.
func (s *Sysfs) DevPath() string { return "/dev/infiniband/" + s.Uverbs }

// PCIDir is the device's PCI directory in the tree, relative to /sys.
func (s *Sysfs) PCIDir() string { return filepath.Join("devices", "pci0000:00", s.PCIAddr) }

// PortCounters and DeviceCounters are the names of EFA's hw_counters files, in the order of the
// kernel driver's efa_port_stats_descs and efa_device_stats_descs (drivers/infiniband/hw/efa).
// The port's are the engine's counters (uverbs.Device.HWCounter), written when a program opens
// one; the device's count the driver's admin queue and its failed commands, which the engine
// does not have: they stay 0.
var (
	PortCounters = []string{"tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops",
		"send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
		"rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes",
		"rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes",
		"retrans_bytes", "retrans_pkts", "retrans_timeout_events",
		"unresponsive_remote_events", "impaired_remote_conn_events"}
	DeviceCounters = []string{"submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds",
		"keep_alive_rcvd", "alloc_pd_err", "create_qp_err", "create_cq_err", "reg_mr_err",
		"alloc_ucontext_err", "create_ah_err", "mmap_err"}
)

// Write creates the tree under root, which stands for the file system's root: root/sys is the
// directory SYSFS_PATH names, laid out as the kernel lays out sysfs for an EFA device, and
// root/dev/infiniband holds an empty file in place of the device node (the shim answers stat
// for it). The class entries are relative links into the PCI device's directory, as the
// kernel's are, so a path that follows them resolves inside the tree:
//
//	class/infiniband/efa_0 -> ../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0
//	class/infiniband_verbs/uverbs_softefa0 -> ../../devices/pci0000:00/0000:00:06.0/infiniband_verbs/uverbs_softefa0
//	dev/char/231:250 -> the same
//	devices/pci0000:00/0000:00:06.0/infiniband/efa_0/device -> ../../../0000:00:06.0
//	devices/pci0000:00/0000:00:06.0/driver -> ../../../bus/pci/drivers/efa
//
// It holds what libibverbs 44 and 64 read to enumerate and match the device (the
// infiniband_verbs entries; node_type, node_guid, GID and pkey files; device/modalias for
// libefa's PCI match), what libfabric's efa provider reads (the PCI address and the driver's name
// from the device and driver links), the port's attributes as the kernel's sysfs.c prints them
// for efa_query_port's answer, and the hw_counters directories with EFA's names.
func (s *Sysfs) Write(root string) error {
	sys := filepath.Join(root, "sys")
	pci := s.PCIDir()
	ibdev := filepath.Join(pci, "infiniband", s.IBDev)
	uv := filepath.Join(pci, "infiniband_verbs", s.Uverbs)
	port := filepath.Join(ibdev, "ports", "1")
	guid := uverbs.GUID(s.GID)
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], guid)
	rate := "100 Gb/sec (4X EDR)"
	if s.SpeedGbps >= 400 {
		rate = "400 Gb/sec (8X HDR)"
	}
	numa, cpus, cpulist := hostLocality()
	files := map[string]string{
		"class/infiniband_verbs/abi_version":         fmt.Sprint(uverbs.UverbsABIVersion),
		filepath.Join(uv, "ibdev"):                   s.IBDev,
		filepath.Join(uv, "dev"):                     fmt.Sprintf("%d:%d", s.Major, s.Minor),
		filepath.Join(uv, "abi_version"):             fmt.Sprint(uverbs.EFAABIVersion),
		filepath.Join(ibdev, "node_type"):            uverbs.NodeTypeSysfs,
		filepath.Join(ibdev, "node_guid"):            hexGroups(g[:]),
		filepath.Join(ibdev, "sys_image_guid"):       hexGroups(g[:]),
		filepath.Join(ibdev, "node_desc"):            s.IBDev,
		filepath.Join(ibdev, "fw_ver"):               "0.0.0.0",
		filepath.Join(ibdev, "hca_type"):             "softefa",
		filepath.Join(port, "gids", "0"):             hexGroups(s.GID[:]),
		filepath.Join(port, "pkeys", "0"):            "0xffff",
		filepath.Join(port, "gid_attrs/types/0"):     "IB/RoCE v1", // config_non_roce_gid_cache: IB_GID_TYPE_IB
		filepath.Join(port, "state"):                 "4: ACTIVE",
		filepath.Join(port, "phys_state"):            "5: LinkUp",
		filepath.Join(port, "link_layer"):            "Unknown", // IB_LINK_LAYER_UNSPECIFIED
		filepath.Join(port, "rate"):                  rate,
		filepath.Join(port, "lid"):                   "0x0",
		filepath.Join(port, "sm_lid"):                "0x0",
		filepath.Join(port, "lid_mask_count"):        "1",
		filepath.Join(port, "sm_sl"):                 "0",
		filepath.Join(port, "cap_mask"):              "0x00000000",
		filepath.Join(port, "hw_counters/lifespan"):  "10",
		filepath.Join(ibdev, "hw_counters/lifespan"): "10",
		filepath.Join(pci, "modalias"):               fmt.Sprintf("pci:v00001D0Fd0000%04Xsv00001D0Fsd0000%04Xbc02sc00i00", s.VendorPartID, s.VendorPartID),
		filepath.Join(pci, "vendor"):                 "0x1d0f",
		filepath.Join(pci, "device"):                 fmt.Sprintf("0x%04x", s.VendorPartID),
		filepath.Join(pci, "subsystem_vendor"):       "0x1d0f",
		filepath.Join(pci, "subsystem_device"):       fmt.Sprintf("0x%04x", s.VendorPartID),
		filepath.Join(pci, "class"):                  "0x020000",
		filepath.Join(pci, "numa_node"):              numa,
		filepath.Join(pci, "local_cpus"):             cpus,
		filepath.Join(pci, "local_cpulist"):          cpulist,
	}
	for _, c := range PortCounters {
		files[filepath.Join(port, "hw_counters", c)] = "0"
	}
	for _, c := range DeviceCounters {
		files[filepath.Join(ibdev, "hw_counters", c)] = "0"
	}
	for name, content := range files {
		if err := writeFile(filepath.Join(sys, name), content+"\n"); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(root, s.DevPath()), ""); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(sys, "bus", "pci", "drivers", "efa"), 0o755); err != nil {
		return err
	}
	// Each link as the kernel makes it: relative, from the link's directory up to the
	// target's parent and down to it (a device link reads ../../../0000:00:06.0, not ../..).
	links := map[string]string{
		filepath.Join("class", "infiniband", s.IBDev):                        ibdev,
		filepath.Join("class", "infiniband_verbs", s.Uverbs):                 uv,
		filepath.Join("dev", "char", fmt.Sprintf("%d:%d", s.Major, s.Minor)): uv,
		filepath.Join(ibdev, "device"):                                       pci,
		filepath.Join(uv, "device"):                                          pci,
		filepath.Join(pci, "driver"):                                         "bus/pci/drivers/efa",
		filepath.Join("bus", "pci", "drivers", "efa", s.PCIAddr):             pci,
	}
	for l, target := range links {
		p := filepath.Join(sys, l)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		rel, err := filepath.Rel(filepath.Dir(l), filepath.Dir(target))
		if err != nil {
			return err
		}
		if err := os.Symlink(filepath.Join(rel, filepath.Base(target)), p); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// hostLocality is what the PCI directory says of the device's NUMA node and local CPUs: node 0's
// CPUs where the host has NUMA nodes (numa_node 0 where it has more than one, -1 otherwise, as
// the kernel writes for a device on a host without NUMA), else every CPU.
func hostLocality() (numa, cpus, cpulist string) {
	numa = "-1"
	if _, err := os.Stat("/sys/devices/system/node/node1"); err == nil {
		numa = "0"
	}
	m, err1 := os.ReadFile("/sys/devices/system/node/node0/cpumap")
	l, err2 := os.ReadFile("/sys/devices/system/node/node0/cpulist")
	if err1 == nil && err2 == nil {
		return numa, strings.TrimSpace(string(m)), strings.TrimSpace(string(l))
	}
	n := runtime.NumCPU()
	words := make([]string, (n+31)/32)
	for i := range words {
		w := uint32(1<<min(32, n-32*i) - 1)
		words[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return numa, strings.Join(words, ","), fmt.Sprintf("0-%d", n-1)
}

// hexGroups formats b as sysfs does GIDs and GUIDs: 4-digit hex groups joined by colons.
func hexGroups(b []byte) string {
	var parts []string
	for i := 0; i+1 < len(b); i += 2 {
		parts = append(parts, fmt.Sprintf("%02x%02x", b[i], b[i+1]))
	}
	return strings.Join(parts, ":")
}
