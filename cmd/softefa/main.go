// Command softefa runs and inspects software EFA devices.
//
//	softefa demo [flags]    an SRD exchange of every operation, checked and timed
//
// Results go to stdout, diagnostics to stderr.
package main

import (
	"fmt"
	"os"
)

var commands = map[string]struct {
	run   func(args []string) error
	usage string
}{
	"demo": {runDemo, "an SRD exchange of every operation between two QPs, checked and timed"},
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
	if err := cmd.run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "softefa %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: softefa COMMAND [flags]\n\ncommands:")
	for name, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", name, c.usage)
	}
}
