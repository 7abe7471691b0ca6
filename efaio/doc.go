// Package efaio holds the binary formats of EFA's I/O descriptors: the TX work-queue entry (64 or
// 128 bytes) that a provider writes into a send queue, the 16-byte RX descriptor it writes into a
// receive queue, and the 16- and 32-byte completion entries the device writes into a completion
// queue. It also holds EFA's completion status codes and the doorbell word layouts.
//
// The layouts are those of rdma-core's providers/efa/efa_io_defs.h (all fields little-endian);
// they are a public contract: a program that writes WQEs and reads CQEs itself, as libfabric's
// direct data path does, sees exactly these bytes. docs/descriptors.md restates them as tables.
//
// Each format is a view over a byte slice (TxWQE, RxDesc, CQE) with a decoder that
// checks every must-be-zero bit and an encoder that writes a whole descriptor. Decoders never
// panic and never read outside the view: they return an error for anything a well-formed
// descriptor cannot contain, so bytes written by an untrusted program are safe to decode.
// Encoders and decoders do not allocate.
package efaio
