//go:build linux

package cabi

// A Setting is a setting of the device inside a program that softefa run starts: a flag of
// softefa run, which hands it to the program's engine and shim in the program's file (Conf),
// under the flag's name, the one way to reach a program that takes no flags of ours.
// docs/settings.md lists them beside config.Device's fields and the commands' flags.
type Setting struct {
	Flag  string // softefa run's flag, without dashes, and its key in the program's file
	Bool  bool   // a boolean flag; else a Go duration (200us, 1ms, 0)
	Usage string
}

// Settings are the settings of softefa run's programs, in the order softefa run -h lists them.
var Settings = []Setting{
	{"rx-spin", false,
		"how long the engine's receive loop keeps reading without waiting after traffic (config.Device.RxSpin); default 0: never,\n" +
			"as the program busy-polls its CQ itself"},
	{"no-sparse-copies", true,
		"no second copy, on another path, of packets sent while few are in flight after a loss (config.Device.NoSparseCopies)"},
	{"no-offload", true,
		"UDP GSO and GRO off: every datagram a packet of its own, as a capture needs (config.Device.NoOffload)"},
	{"debug", true, "the shim and engine report their traps and counts on stderr"},
}
