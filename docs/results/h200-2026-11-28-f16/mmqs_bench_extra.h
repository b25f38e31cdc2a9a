// the f16 experiment's variants (Q4_K only), beside the product's
if constexpr (type == GGML_TYPE_Q4_K) {
    v.push_back({"f16-nt2-r1-ld1", 0, run_f16<2, 1, 1>, 2, 16});
    v.push_back({"f16-nt2-r2-ld1", 0, run_f16<2, 2, 1>, 2, 16});
    v.push_back({"f16-nt3-r1-ld1", 0, run_f16<3, 1, 1>, 3, 24});
    v.push_back({"f16-nt3-r2-ld1", 0, run_f16<3, 2, 1>, 3, 24});
    v.push_back({"f16-nt3-r1-ld0", 0, run_f16<3, 1, 0>, 3, 24});
    v.push_back({"f16-nt4-r1-ld1", 0, run_f16<4, 1, 1>, 4, 32});
}
