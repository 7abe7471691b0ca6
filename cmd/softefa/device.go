//go:build linux

package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/hostdev"
	"github.com/softefa/softefa/internal/uverbs"
	"github.com/softefa/softefa/link"
)

// runDevice is softefa device: the host's device, which the programs softefa run --host starts
// share (internal/hostdev); softefa device status and stop ask a running one.
func runDevice(args []string) error {
	if len(args) > 0 && (args[0] == "status" || args[0] == "stop") {
		return deviceClient(args[0], args[1:])
	}
	closeInherited() // (a daemon: it keeps nothing of its starter's but stdio)
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	name := fs.String("name", "efa_0", "the device name")
	socket := fs.String("socket", "", "the socket programs reach the device through (default "+hostdev.DefaultSocket("NAME")+")")
	addr := fs.String("addr", "127.0.0.1:4791", "the device's UDP endpoint IP:PORT (its GID)")
	paths := fs.Int("paths", 0, "UDP paths (default 4)")
	partID := fs.Uint("part-id", 0xefa1, "the PCI device id (vendor_part_id) programs see")
	share := fs.Float64("program-share", hostdev.DefaultProgramShare, "the share of each of the device's maxima (PDs, MRs, CQs, QPs, AHs) one program may hold")
	if err := parseFlags(fs, "softefa device [flags] | softefa device status|stop [--socket PATH]", args); err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	if *socket == "" {
		*socket = hostdev.DefaultSocket(*name)
	}
	cfg := config.Device{Name: *name, Addr: ap, Paths: *paths, VendorPartID: uint32(*partID)}
	if cfg.Key, err = config.KeyFromEnvIfSet(); err != nil {
		return err
	}
	l, err := link.ListenUDP(ap, max(cfg.Paths, config.Default().Paths))
	if err != nil {
		return err
	}
	cfg.Link = l
	e, err := engine.NewDevice(cfg)
	if err != nil {
		l.Close()
		return err
	}
	defer e.Close()
	d := uverbs.NewDevice(e)
	defer d.Close()
	if err := os.MkdirAll(filepath.Dir(*socket), 0o700); err != nil {
		return err
	}
	if *share <= 0 || *share > 1 {
		return fmt.Errorf("--program-share %v: want 0 < share ≤ 1", *share)
	}
	s, err := hostdev.Listen(d, *socket)
	if err != nil {
		return err
	}
	s.ProgramShare = *share
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-sig:
		case <-s.Stopped():
		}
		s.Close()
	}()
	fmt.Fprintf(os.Stderr, "softefa device: %s at %v, programs connect to %s\n", *name, ap, *socket)
	return s.Serve()
}

// deviceClient is softefa device status and stop.
func deviceClient(what string, args []string) error {
	fs := flag.NewFlagSet("device "+what, flag.ContinueOnError)
	name := fs.String("name", "efa_0", "the device name")
	socket := fs.String("socket", "", "the device's socket (default "+hostdev.DefaultSocket("NAME")+")")
	if err := parseFlags(fs, "softefa device "+what+" [--socket PATH]", args); err != nil {
		return err
	}
	if *socket == "" {
		*socket = hostdev.DefaultSocket(*name)
	}
	c, err := hostdev.Dial(*socket)
	if err != nil {
		return err
	}
	defer c.Close()
	if what == "stop" {
		return c.Stop()
	}
	info, err := c.Info()
	if err != nil {
		return err
	}
	st, err := c.Status()
	if err != nil {
		return err
	}
	fmt.Printf("device %s\naddr %v\nsocket %s\n%s", info.Name, config.AddrFromGID(info.GID, 0), *socket, st)
	return nil
}
