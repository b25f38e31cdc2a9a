// the sub-blocks' scales folded into the quants (LD bit 3), chained MMAs, no IMAD per sub-block
V2(2, 4, 0, 9); V2(3, 3, 0, 9); V2(4, 3, 0, 9); V2(4, 4, 0, 9);
