package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// softefa devinfo: ibv_devinfo for a softefa device made from the flags, plus the efadv
// attributes and caps in words.

var capNames = []struct {
	bit  efadv.DeviceCaps
	name string
}{
	{efadv.DeviceAttrCapsRDMARead, "RDMA_READ"},
	{efadv.DeviceAttrCapsRNRRetry, "RNR_RETRY"},
	{efadv.DeviceAttrCapsCQWithSGID, "CQ_WITH_SGID"},
	{efadv.DeviceAttrCapsRDMAWrite, "RDMA_WRITE"},
	{efadv.DeviceAttrCapsUnsolicitedWriteRecv, "UNSOLICITED_WRITE_RECV"},
	{efadv.DeviceAttrCapsCQWithExtMemDMABuf, "CQ_WITH_EXT_MEM_DMABUF"},
	{efadv.DeviceAttrCapsCompCntr, "COMP_CNTR"},
}

func capWords(caps efadv.DeviceCaps) []string {
	var out []string
	for _, c := range capNames {
		if caps&c.bit != 0 {
			out = append(out, c.name)
		}
	}
	return out
}

func runDevinfo(args []string) error { return devinfo(args, os.Stdout) }

func devinfo(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("devinfo", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "every attribute, as ibv_devinfo -v")
	asJSON := fs.Bool("json", false, "one JSON object")
	addr := fs.String("addr", "", "bind the device to this UDP address (default: none, loopback only)")
	mtu := fs.Int("mtu", 0, "device MTU (max_msg_sz), 64 to 65536; default 8192")
	if err := parseFlags(fs, "softefa devinfo [flags]", args); err != nil {
		return err
	}
	if *mtu != 0 && (*mtu < 64 || *mtu > 1<<16) {
		return fmt.Errorf("--mtu %d: 64 to 65536 bytes (0: the default)", *mtu)
	}
	cfg := config.Device{MTU: *mtu}
	if *addr != "" {
		ap, err := parseAddr(*addr)
		if err != nil {
			return fmt.Errorf("--addr %q: %w", *addr, err)
		}
		cfg.Addr = ap
	}
	dev, err := verbs.NewDevice(cfg)
	if err != nil {
		return err
	}
	defer dev.Close()
	ctx, err := dev.Open()
	if err != nil {
		return err
	}
	defer ctx.Close()
	a := ctx.QueryDevice()
	port, _ := ctx.QueryPort(1)
	gid, _ := ctx.QueryGID(1, 0)
	efa, err := efadv.QueryDevice(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(w).Encode(map[string]any{
			"hca_id": dev.Name(), "transport": "unspecified", "fw_ver": a.FWVer,
			"node_guid": fmt.Sprintf("%016x", a.NodeGUID), "vendor_id": a.VendorID, "vendor_part_id": a.VendorPartID,
			"hw_ver": a.HWVer, "phys_port_cnt": a.PhysPortCnt, "max_msg_sz": port.MaxMsgSz, "max_rdma_size": efa.MaxRDMASize,
			"max_qp": a.MaxQP, "max_qp_wr": a.MaxQPWR, "max_sge": a.MaxSGE, "max_sge_rd": a.MaxSGERD, "max_cq": a.MaxCQ,
			"max_cqe": a.MaxCQE, "max_mr": a.MaxMR, "max_mr_size": a.MaxMRSize, "max_pd": a.MaxPD, "max_ah": a.MaxAH,
			"max_pkeys": a.MaxPKeys, "gid": gid.String(), "address": dev.Addr().String(), "port_state": "PORT_ACTIVE",
			"active_mtu": 256 << (port.ActiveMTU - 1),
			"max_sq_wr":  efa.MaxSQWR, "max_rq_wr": efa.MaxRQWR, "max_sq_sge": efa.MaxSQSGE, "max_rq_sge": efa.MaxRQSGE,
			"inline_buf_size": efa.InlineBufSize, "inline_buf_size_ex": efa.InlineBufSizeEx,
			"device_caps": efa.DeviceCaps, "device_caps_names": capWords(efa.DeviceCaps),
		})
	}
	p := func(k string, v any) { fmt.Fprintf(w, "\t%-24s%v\n", k+":", v) }
	fmt.Fprintf(w, "hca_id:\t%s\n", dev.Name())
	p("transport", "unspecified (0)")
	p("fw_ver", a.FWVer)
	p("node_guid", fmt.Sprintf("%04x:%04x:%04x:%04x", a.NodeGUID>>48, a.NodeGUID>>32&0xffff, a.NodeGUID>>16&0xffff, a.NodeGUID&0xffff))
	p("vendor_id", fmt.Sprintf("0x%04x", a.VendorID))
	p("vendor_part_id", fmt.Sprintf("%d (0x%04x)", a.VendorPartID, a.VendorPartID))
	p("hw_ver", fmt.Sprintf("0x%x", a.HWVer))
	p("phys_port_cnt", a.PhysPortCnt)
	if *verbose {
		for _, kv := range []struct {
			k string
			v any
		}{
			{"max_mr_size", fmt.Sprintf("0x%x", a.MaxMRSize)}, {"page_size_cap", fmt.Sprintf("0x%x", a.PageSizeCap)},
			{"max_qp", a.MaxQP}, {"max_qp_wr", a.MaxQPWR}, {"max_sge", a.MaxSGE}, {"max_sge_rd", a.MaxSGERD},
			{"max_cq", a.MaxCQ}, {"max_cqe", a.MaxCQE}, {"max_mr", a.MaxMR}, {"max_pd", a.MaxPD}, {"max_ah", a.MaxAH},
			{"max_pkeys", a.MaxPKeys},
		} {
			p(kv.k, kv.v)
		}
	}
	fmt.Fprintf(w, "\t\tport:\t1\n")
	q := func(k string, v any) { fmt.Fprintf(w, "\t\t\t%-22s%v\n", k+":", v) }
	q("state", "PORT_ACTIVE (4)")
	q("max_mtu", fmt.Sprintf("%d (%d)", 256<<(port.MaxMTU-1), port.MaxMTU))
	q("active_mtu", fmt.Sprintf("%d (%d)", 256<<(port.ActiveMTU-1), port.ActiveMTU))
	q("link_layer", "Unspecified")
	if *verbose {
		q("max_msg_sz", fmt.Sprintf("0x%x", port.MaxMsgSz))
		q("gid_tbl_len", port.GIDTblLen)
		q("pkey_tbl_len", port.PKeyTblLen)
		q("GID[  0]", gid.String())
		q("address", dev.Addr())
	}
	fmt.Fprintf(w, "\tefadv:\n")
	e := func(k string, v any) { fmt.Fprintf(w, "\t\t%-24s%v\n", k+":", v) }
	e("max_sq_wr", efa.MaxSQWR)
	e("max_rq_wr", efa.MaxRQWR)
	e("max_sq_sge", efa.MaxSQSGE)
	e("max_rq_sge", efa.MaxRQSGE)
	e("inline_buf_size", efa.InlineBufSize)
	e("inline_buf_size_ex", efa.InlineBufSizeEx)
	e("max_rdma_size", efa.MaxRDMASize)
	e("device_caps", fmt.Sprintf("0x%x (%s)", efa.DeviceCaps, strings.Join(capWords(efa.DeviceCaps), ", ")))
	return nil
}
