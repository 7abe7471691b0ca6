// Command softefa runs and inspects software EFA devices.
//
//	softefa demo [flags]          an SRD exchange of every operation over UDP, checked and timed
//	softefa devinfo [-v] [--json] a device's attributes, as ibv_devinfo shows them
//	softefa perf TEST [flags]     perftest's send/write/read bandwidth and latency tests over SRD
//	softefa pingpong [flags]      the rdma-core pingpong example over SRD or UD, checking data
//	softefa fabric --to ADDR      a multipath fabric emulator with impairments, for real processes
//	softefa run -- COMMAND ARGS   an unmodified rdma-core program on a softefa device (docs/cabi.md)
//	softefa device [flags]        the host's device, which programs run with softefa run --host share
//
// Results go to stdout, diagnostics to stderr.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
)

var commands = map[string]struct {
	run   func(args []string) error
	usage string
}{
	"demo":     {runDemo, "an SRD exchange of every operation over UDP, checked and timed"},
	"device":   {runDevice, "the host's device, shared by the programs softefa run --host starts; status, stop"},
	"fabric":   {runFabric, "a userspace multipath network with impairments between UDP clients and a server"},
	"devinfo":  {runDevinfo, "a device's attributes, as ibv_devinfo -v shows them, with the efadv caps"},
	"perf":     {runPerf, "send_bw|send_lat|write_bw|write_lat|read_bw|read_lat, as perftest"},
	"pingpong": {runPingpong, "the rdma-core srd/ud pingpong example, checking data"},
	"run":      {runRun, "run an unmodified rdma-core program (ibv_devinfo, pyverbs, perftest, fi_*) on a softefa device"},
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "softefa: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(os.Args[2:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "softefa %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: softefa COMMAND [flags]\n\ncommands:")
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", name, commands[name].usage)
	}
}
