// session 23: version 2 with other warps a block (the split of K within a block), the product's
// loads (pf0, ld1): wW-ntN-bB = W warps, N tiles, __launch_bounds__ for B blocks an SM
#define V2W(W, NT, MINB) v.push_back({"w" #W "-nt" #NT "-b" #MINB, 0, run_v2<W, NT, MINB, 0, 1, type>, NT, NT == 3 ? 24 : 64})
    V2W(2, 2, 8); V2W(3, 2, 5); V2W(6, 2, 2); V2W(8, 2, 2); V2W(16, 2, 1);
    V2W(2, 3, 6); V2W(3, 3, 4); V2W(6, 3, 2); V2W(8, 3, 2); V2W(12, 3, 1);
#undef V2W
