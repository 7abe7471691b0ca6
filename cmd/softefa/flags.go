package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// parseFlags parses args into fs, refusing arguments left after the flags. -h prints usage and
// the flags to stderr and gives flag.ErrHelp, which main takes for success.
func parseFlags(fs *flag.FlagSet, usage string, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "usage: %s\n\nflags:\n", usage)
		fs.SetOutput(os.Stderr)
		fs.PrintDefaults()
		return err
	}
	if err == nil && fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags go after the command; see -h)", fs.Arg(0))
	}
	return err
}

// setFlags is the set of flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// secondsFlag is a duration given as perftest gives -D, in seconds ("2", "0.5"), or as a Go
// duration ("1m30s", "500ms").
type secondsFlag time.Duration

func (d *secondsFlag) String() string { return time.Duration(*d).String() }

func (d *secondsFlag) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f > float64(1<<63-1)/1e9 || f < -float64(1<<63-1)/1e9 {
			return errors.New("out of range")
		}
		*d = secondsFlag(f * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want seconds (2) or a duration (1m30s)")
	}
	*d = secondsFlag(v)
	return nil
}

// checkHostPort refuses an address that is not HOST:PORT with a port number, naming flag.
func checkHostPort(flagName, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
		if err != nil {
			err = fmt.Errorf("port %q is not a number from 0 to 65535", port)
		}
	}
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT: %w", flagName, addr, err)
	}
	return nil
}

// checkMode refuses anything but exactly one of --server, --connect and --loopback, and
// --listen without --server.
func checkMode(set map[string]bool, server, loopback bool, connect string) error {
	var modes []string
	if server {
		modes = append(modes, "--server")
	}
	if connect != "" || set["connect"] {
		modes = append(modes, "--connect")
	}
	if loopback {
		modes = append(modes, "--loopback")
	}
	switch {
	case set["connect"] && connect == "":
		return errors.New("--connect: give the server's HOST:PORT")
	case len(modes) == 0:
		return errors.New("give --server, --connect ADDR or --loopback")
	case len(modes) > 1:
		return fmt.Errorf("%s: give one of --server, --connect ADDR and --loopback", strings.Join(modes, " and "))
	case set["listen"] && !server:
		return fmt.Errorf("--listen is the server's address: it needs --server (with %s it would be ignored)", modes[0])
	}
	return nil
}

// serveBeside runs serve, a server accepting on ln, in a goroutine beside client (--loopback),
// and returns both their errors. ln is closed when the client returns: a client that never
// connected leaves the server in Accept, whose error is then no news.
func serveBeside(ln net.Listener, serve, client func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	cerr := client()
	ln.Close()
	serr := <-errc
	if cerr != nil && errors.Is(serr, net.ErrClosed) {
		serr = nil
	}
	return errors.Join(cerr, serr)
}
