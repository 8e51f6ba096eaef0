"""The float32 reference attention (needs torch): the oracle that tests, the fallback and depth verify
compare with. Imported by runtime/, probing's verify and the transformers integration; imports neither.

    semantics           what is computed, written once: masks, diagonal, window, ALiBi, padding,
                        soft-capping, the extra softmax logit (off_by_one, learnable sink)
    autograd_reference  attend / reference_attention: the whole score block, differentiated by
                        autograd, with its argument checks
    chunked_reference   verify's forward and analytic backward, a chunk of query rows at a time
"""
