// Package softefa carries the sources of softefa's C-ABI libraries (the preload shim and the
// engine library of docs/cabi.md) inside the programs that build them on demand, so that a
// softefa installed with `go install github.com/softefa/softefa/cmd/softefa@...` runs programs
// from any directory, with no source tree (cabi.LocateFrom).
package softefa

import "embed"

// Source holds go.mod, go.sum and every file of the packages the libraries are built from.
//
//go:embed go.mod go.sum cabi/*.go cabi/shim/*.c cabi/shim/*.h cabi/libengine/*.go config/*.go efaio/*.go
//go:embed internal/uapi/*.go internal/qpn/*.go internal/wire/*.go internal/engine/*.go internal/seal/*.go internal/srd/*.go
//go:embed internal/uverbs/*.go internal/mem/*.go internal/hostdev/*.go link/*.go
var Source embed.FS
