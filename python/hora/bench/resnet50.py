"""The 161 gradient shapes of torchvision's ResNet-50 (25.6 M float32
parameters, 97.5 MiB), derived from the architecture so no model download or
framework is needed."""


def gradient_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_channels = width * 4
            shapes += [(width, in_channels, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out_channels, width, 1, 1), (out_channels,), (out_channels,)]
            if block == 0:
                shapes += [(out_channels, in_channels, 1, 1), (out_channels,), (out_channels,)]
            in_channels = out_channels
    shapes += [(1000, 2048), (1000,)]
    return shapes
