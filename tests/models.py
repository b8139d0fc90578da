"""Small models written for the tests, each with the shape of its layers in a comment."""

import torch.nn as nn
import torch.nn.functional as F


class Call(nn.Module):
    """A module whose forward is one function, so the graph holds that op under the root."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


class TwoLayerMLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):  # (B, d_in) -> (B, d_out)
        return self.fc2(self.act(self.fc1(x)))


class SharedLayer(nn.Module):
    """One Linear called twice, a functional matmul in the root, and a tied weight."""

    def __init__(self, d=16):
        super().__init__()
        self.shared = nn.Linear(d, d)
        self.other = nn.Linear(d, d, bias=False)
        self.other.weight = self.shared.weight

    def forward(self, x):  # (B, d)
        y = self.shared(self.shared(x))
        return self.other(y) @ x.T  # (B, B), a matmul owned by the root itself


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):  # (B, 3, H, W)
        x = F.relu(self.bn(self.conv(x)))
        x = F.max_pool2d(self.depthwise(x), 2)
        x = self.pool(self.up(x)).flatten(1)
        return self.fc(x)


class LeNet5(nn.Module):
    """LeCun et al. 1998's LeNet-5 on 32x32 single-channel images, ReLU and max pooling."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):  # (B, 1, 32, 32)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, 6, 14, 14)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)  # (B, 400)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))  # (B, 10)


class Block(nn.Module):
    """A residual Linear + ReLU block of width ``d``."""

    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.ReLU()

    def forward(self, x):  # (B, d)
        return x + self.act(self.fc(x))


class BlockStack(nn.Module):
    """Three identical blocks, then a wider one, then a head: the tree collapses the first three
    into one row and keeps the fourth apart."""

    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(3)])
        self.up = nn.Linear(d, 2 * d)
        self.wide = Block(2 * d)
        self.head = nn.Linear(2 * d, 1)

    def forward(self, x):  # (B, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.wide(self.up(x)))  # (B, 1)
