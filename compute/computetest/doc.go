// Package computetest is the one conformance suite every compute.Backend
// runs (cpu, msl-cpu, metal, cuda): Run checks a backend against a float64
// oracle, checks every validation error, batching and determinism. It also
// holds the deterministic input generators (SplitMix64, Uniform) and the
// oracle and tolerance (Oracle, Compare) that other tests and the synthetic
// job generator reuse, so every consumer agrees on what "correct" means.
package computetest
