package compute

// Fusable finds the DX and DW in next that read inv's r from inv's x;
// users lists the ops of next that touch inv.R. It fuses only when those
// are the sole users of r in next, there is at most one of each, they
// agree on dy and the DX's eps (used at dim 1) is the RMSInv's: then computing r inside their row loop changes nothing
// anyone can observe. Backends use it to run RMSInv, DX and DW as one
// pass over each row while the row is in cache.
func Fusable(inv *Op, next []Op, users []int) (dxi, dwi int, ok bool) {
	dxi, dwi = -1, -1
	for _, i := range users {
		o := &next[i]
		switch {
		case o.Kind == OpDX && o.R == inv.R && o.X == inv.X && dxi < 0 && o.DX != inv.R && o.W != inv.R && o.DY != inv.R && o.Eps() == inv.Eps():
			dxi = i
		case o.Kind == OpDW && o.R == inv.R && o.X == inv.X && dwi < 0 && o.DW != inv.R && o.DY != inv.R:
			dwi = i
		default:
			return -1, -1, false
		}
	}
	if dxi < 0 && dwi < 0 {
		return -1, -1, false
	}
	if dxi >= 0 && dwi >= 0 && next[dxi].DY != next[dwi].DY {
		return -1, -1, false
	}
	return dxi, dwi, true
}

// Users maps, for each phase (the ops between two barriers), every buffer to
// the indices of the ops of that phase that touch it, in order and once
// each, so that Fusable is found in linear time for large batches.
func Users(phases [][]Op) []map[Buffer][]int {
	users := make([]map[Buffer][]int, len(phases))
	for k, ph := range phases {
		m := make(map[Buffer][]int, 6*len(ph))
		for i := range ph {
			o := &ph[i]
			for _, buf := range [...]Buffer{o.X, o.W, o.DY, o.R, o.DX, o.DW} {
				if buf == nil {
					continue
				}
				if l := m[buf]; len(l) == 0 || l[len(l)-1] != i {
					m[buf] = append(l, i)
				}
			}
		}
		users[k] = m
	}
	return users
}

// Phases splits ops at their barriers into the groups that may run
// concurrently, dropping empty ones. The phases share ops' backing array.
func Phases(ops []Op) [][]Op {
	var phases [][]Op
	start := 0
	for i := range ops {
		if ops[i].Kind == OpBarrier {
			if i > start {
				phases = append(phases, ops[start:i])
			}
			start = i + 1
		}
	}
	if start < len(ops) {
		phases = append(phases, ops[start:])
	}
	return phases
}
